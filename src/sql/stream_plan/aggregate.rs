//! GROUP BY and its aggregate calls.

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Schema};
use datafusion::common::DFSchema;
use datafusion::logical_expr::{Aggregate, Expr, ExprSchemable};
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_plan::PhysicalExpr;

use super::{no_window_to_close, unsupported, Build, Planner};
use crate::error::{Error, ErrorKind, Result};
use crate::stream::spec::{AggCall, AggKind, AggSpec};
use crate::stream::PlanNode;
/// At most this many aggregates per view: state keys number them with one byte.
const AGGREGATES_MAX: usize = 255;

impl Planner<'_> {
    /// A GROUP BY with its aggregate calls.
    ///
    /// The groups are kept in one order whatever the query's (by their text), with a
    /// projection above that puts the columns back: two GROUP BYs of the same columns in
    /// different orders are then one subplan, computed once (`StreamPlan::fragments`).
    pub(super) fn aggregate(&self, agg: &Aggregate, build: &mut Build) -> Result<PlanNode> {
        let input = self.node(&agg.input, build)?;
        let input_schema = agg.input.schema();
        let mut order: Vec<usize> = (0..agg.group_expr.len()).collect();
        let texts: Vec<String> = agg.group_expr.iter().map(|g| g.to_string()).collect();
        order.sort_by(|&a, &b| texts[a].cmp(&texts[b]));
        let mut group_exprs = Vec::new();
        let mut group_types = Vec::new();
        for g in order.iter().map(|&i| &agg.group_expr[i]) {
            if matches!(g, Expr::GroupingSet(_)) {
                return Err(unsupported(
                    "GROUPING SETS, ROLLUP and CUBE",
                    "grouping sets",
                ));
            }
            group_exprs.push(self.physical(g, input_schema)?);
            group_types.push(g.get_type(input_schema)?);
        }
        let wanted: Schema = agg.schema.as_arrow().clone();
        let groups = order.len();
        let output = Schema::new(
            (order.iter().copied())
                .chain(groups..wanted.fields().len())
                .map(|i| wanted.field(i).clone())
                .collect::<Vec<_>>(),
        );
        let mut calls = Vec::new();
        for (i, e) in agg.aggr_expr.iter().enumerate() {
            let output_type = output.field(agg.group_expr.len() + i).data_type().clone();
            calls.push(self.agg_call(e, input_schema, output_type)?);
        }
        if calls.len() > AGGREGATES_MAX {
            return Err(Error::new(
                ErrorKind::ProgramLimitExceeded,
                format!(
                    "a materialized view can compute at most {AGGREGATES_MAX} aggregates per GROUP BY"
                ),
            ));
        }
        let close_on = if self.emit_on_window_close {
            let watermarked = self.watermark_columns(&input, build);
            let window = group_exprs.iter().position(|g| {
                g.downcast_ref::<datafusion::physical_expr::expressions::Column>()
                    .is_some_and(|c| watermarked.contains(&c.index()))
            });
            let Some(window) = window else {
                return Err(no_window_to_close());
            };
            build.closes_windows = true;
            Some(window)
        } else {
            None
        };
        let append_only = self.append_only(&input, build);
        let output = Arc::new(output);
        let node = PlanNode::Aggregate {
            input: Box::new(input),
            spec: AggSpec {
                group_exprs,
                group_types,
                calls,
                schema: output.clone(),
                close_on,
                append_only,
                early: false,
            },
        };
        if order.iter().enumerate().all(|(i, &o)| i == o) {
            return Ok(node);
        }
        // The query's order of columns over the aggregate's.
        let exprs = (0..wanted.fields().len())
            .map(|i| {
                let at = order.iter().position(|&o| o == i).unwrap_or(i);
                Arc::new(Column::new(wanted.field(i).name(), at)) as Arc<dyn PhysicalExpr>
            })
            .collect();
        Ok(PlanNode::Project {
            input: Box::new(node),
            exprs,
            input_schema: output,
            schema: Arc::new(wanted),
        })
    }

    pub(super) fn agg_call(
        &self,
        e: &Expr,
        input_schema: &DFSchema,
        output_type: DataType,
    ) -> Result<AggCall> {
        let e = match e {
            Expr::Alias(a) => a.expr.as_ref(),
            other => other,
        };
        let Expr::AggregateFunction(f) = e else {
            return Err(Error::not_supported(format!(
                "aggregate expression {e} is not supported in materialized views"
            )));
        };
        let name = f.func.name().to_lowercase();
        let p = &f.params;
        if !p.order_by.is_empty() {
            return Err(unsupported("ordered aggregates", "ordered aggregates"));
        }
        let kind =
            match name.as_str() {
                "count" => AggKind::Count,
                "sum" => AggKind::Sum,
                "avg" | "mean" => AggKind::Avg,
                "min" => AggKind::Min,
                "max" => AggKind::Max,
                "bool_and" => AggKind::BoolAnd,
                "bool_or" => AggKind::BoolOr,
                other => return Err(Error::not_supported(format!(
                    "aggregate function {other}() is not supported in materialized views"
                ))
                .with_hint(
                    "Materialized views support COUNT, SUM, AVG, MIN, MAX, BOOL_AND and BOOL_OR.",
                )),
            };
        let [arg] = p.args.as_slice() else {
            return Err(Error::not_supported(format!(
                "{name}() with {} arguments is not supported in materialized views",
                p.args.len()
            )));
        };
        let arg_type = arg.get_type(input_schema)?;
        let supported = match kind {
            AggKind::Count | AggKind::Min | AggKind::Max => true,
            AggKind::Sum | AggKind::Avg | AggKind::SumCounts => arg_type.is_numeric(),
            AggKind::BoolAnd | AggKind::BoolOr => arg_type == DataType::Boolean,
        };
        if !supported {
            return Err(Error::new(
                ErrorKind::TypeMismatch,
                format!("function {name}({arg_type}) does not exist"),
            ));
        }
        let filter = match &p.filter {
            Some(f) => Some(self.physical(f, input_schema)?),
            None => None,
        };
        Ok(AggCall {
            kind,
            arg: self.physical(arg, input_schema)?,
            arg_type,
            output_type,
            distinct: p.distinct,
            filter,
        })
    }
}
