//! Compiles a view's DataFusion logical plan into a `StreamPlan` of incremental operators, or
//! refuses it (SQLSTATE 0A000, with a hint) when Weir cannot maintain it incrementally.

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Schema};
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::DFSchema;
use datafusion::execution::context::SessionState;
use datafusion::logical_expr::{Expr, ExprSchemable, LogicalPlan, Volatility};
use datafusion::physical_plan::PhysicalExpr;

use crate::catalog::{Catalog, ObjectId};
use crate::error::{Error, ErrorKind, Result};
use crate::stream::operators::hash_agg::{AggCall, AggKind};
use crate::stream::plan::{PlanNode, StreamPlan};

/// At most this many aggregates per view: state keys number them with one byte.
const AGGREGATES_MAX: usize = 255;

/// Refuses expressions whose value is not a function of the row alone: volatile functions
/// (random()) would make a deletion retract something other than what the insertion added,
/// and time functions (now()) change the result as time passes.
pub fn check_deterministic(plan: &LogicalPlan) -> Result<()> {
    let mut found: Option<String> = None;
    plan.apply_with_subqueries(|node| {
        for e in node.expressions() {
            e.apply(|e| {
                if let Expr::ScalarFunction(f) = e {
                    if f.func.signature().volatility != Volatility::Immutable {
                        found = Some(f.func.name().to_string());
                        return Ok(TreeNodeRecursion::Stop);
                    }
                }
                Ok(TreeNodeRecursion::Continue)
            })?;
        }
        Ok(if found.is_some() {
            TreeNodeRecursion::Stop
        } else {
            TreeNodeRecursion::Continue
        })
    })?;
    match found {
        Some(name) => Err(Error::not_supported(format!(
            "function {name}() cannot be used in a materialized view"
        ))
        .with_hint(
            "A materialized view can only use functions whose result depends on their arguments alone.",
        )),
        None => Ok(()),
    }
}

pub struct Planner<'a> {
    pub state: &'a SessionState,
    pub catalog: &'a Catalog,
}

/// The chain being built: the relation it reads and the operators so far.
struct Chain {
    input: ObjectId,
    nodes: Vec<PlanNode>,
    aggregates: usize,
}

impl Planner<'_> {
    /// Compiles an (optimised) plan. Returns the stream plan and the relations it reads.
    pub fn plan(&self, plan: &LogicalPlan) -> Result<(StreamPlan, Vec<ObjectId>)> {
        let chain = self.node(plan)?;
        let schema = Arc::new(plan.schema().as_arrow().clone());
        let input = chain.input;
        Ok((
            StreamPlan {
                input,
                nodes: chain.nodes,
                schema,
            },
            vec![input],
        ))
    }

    fn physical(&self, e: &Expr, schema: &DFSchema) -> Result<Arc<dyn PhysicalExpr>> {
        Ok(self.state.create_physical_expr(e.clone(), schema)?)
    }

    fn node(&self, plan: &LogicalPlan) -> Result<Chain> {
        match plan {
            LogicalPlan::TableScan(scan) => {
                let name = scan.table_name.table();
                let object = self
                    .catalog
                    .get(name)
                    .ok_or_else(|| crate::catalog::undefined_table(name))?;
                let id = object.id();
                let mut nodes = Vec::new();
                if let Some(fetch) = scan.fetch {
                    return Err(unsupported(&format!("LIMIT {fetch}"), "Top-N views"));
                }
                let full = self
                    .catalog
                    .schema(id)
                    .ok_or_else(|| Error::internal(format!("no schema for relation {name}")))?;
                if !scan.filters.is_empty() {
                    let df = DFSchema::try_from_qualified_schema(scan.table_name.clone(), &full)?;
                    let conj = scan
                        .filters
                        .iter()
                        .cloned()
                        .reduce(Expr::and)
                        .expect("non-empty");
                    nodes.push(PlanNode::Filter {
                        predicate: self.physical(&conj, &df)?,
                    });
                }
                if let Some(projection) = &scan.projection {
                    let exprs = projection
                        .iter()
                        .map(|i| {
                            let f = full.field(*i);
                            Arc::new(datafusion::physical_expr::expressions::Column::new(
                                f.name(),
                                *i,
                            )) as Arc<dyn PhysicalExpr>
                        })
                        .collect();
                    nodes.push(PlanNode::Project {
                        exprs,
                        schema: Arc::new(scan.projected_schema.as_arrow().clone()),
                    });
                }
                Ok(Chain {
                    input: id,
                    nodes,
                    aggregates: 0,
                })
            }
            LogicalPlan::Projection(p) => {
                let mut chain = self.node(&p.input)?;
                let input_schema = p.input.schema();
                let exprs = p
                    .expr
                    .iter()
                    .map(|e| self.physical(e, input_schema))
                    .collect::<Result<Vec<_>>>()?;
                chain.nodes.push(PlanNode::Project {
                    exprs,
                    schema: Arc::new(p.schema.as_arrow().clone()),
                });
                Ok(chain)
            }
            LogicalPlan::Filter(f) => {
                let mut chain = self.node(&f.input)?;
                if f.predicate.contains_outer() || has_subquery(&f.predicate) {
                    return Err(unsupported("subqueries", "joins"));
                }
                chain.nodes.push(PlanNode::Filter {
                    predicate: self.physical(&f.predicate, f.input.schema())?,
                });
                Ok(chain)
            }
            LogicalPlan::SubqueryAlias(a) => self.node(&a.input),
            LogicalPlan::Aggregate(agg) => {
                let mut chain = self.node(&agg.input)?;
                let input_schema = agg.input.schema();
                let mut group_exprs = Vec::new();
                let mut group_types = Vec::new();
                for g in &agg.group_expr {
                    if matches!(g, Expr::GroupingSet(_)) {
                        return Err(unsupported(
                            "GROUPING SETS, ROLLUP and CUBE",
                            "grouping sets",
                        ));
                    }
                    group_exprs.push(self.physical(g, input_schema)?);
                    group_types.push(g.get_type(input_schema)?);
                }
                let output: Schema = agg.schema.as_arrow().clone();
                let mut calls = Vec::new();
                for (i, e) in agg.aggr_expr.iter().enumerate() {
                    let output_type = output.field(agg.group_expr.len() + i).data_type().clone();
                    calls.push(self.agg_call(e, input_schema, output_type)?);
                }
                chain.aggregates += calls.len();
                if chain.aggregates > AGGREGATES_MAX {
                    return Err(Error::new(
                        ErrorKind::ProgramLimitExceeded,
                        format!(
                            "a materialized view can compute at most {AGGREGATES_MAX} aggregates"
                        ),
                    ));
                }
                chain.nodes.push(PlanNode::Aggregate {
                    group_exprs,
                    group_types,
                    calls,
                    schema: Arc::new(output),
                });
                Ok(chain)
            }
            LogicalPlan::Join(_) => Err(unsupported("joins", "joins")),
            LogicalPlan::Union(_) => Err(unsupported("UNION", "set operations")),
            LogicalPlan::Sort(_) => Err(unsupported("ORDER BY", "Top-N views")),
            LogicalPlan::Limit(_) => Err(unsupported("LIMIT and OFFSET", "Top-N views")),
            LogicalPlan::Distinct(_) => Err(unsupported("DISTINCT", "DISTINCT")),
            LogicalPlan::Window(_) => Err(unsupported("window functions", "window functions")),
            LogicalPlan::EmptyRelation(_) | LogicalPlan::Values(_) => Err(Error::not_supported(
                "a materialized view must read from a table or another materialized view",
            )
            .with_hint("Put the constant rows into a table and define the view over it.")),
            other => Err(Error::not_supported(format!(
                "{} cannot be maintained incrementally",
                other.display()
            ))),
        }
    }

    fn agg_call(
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
        if p.distinct {
            return Err(unsupported(
                &format!("{}(DISTINCT ...)", name.to_uppercase()),
                "DISTINCT aggregates",
            ));
        }
        if p.filter.is_some() {
            return Err(unsupported("aggregate FILTER clauses", "aggregate filters"));
        }
        if !p.order_by.is_empty() {
            return Err(unsupported("ordered aggregates", "ordered aggregates"));
        }
        let kind = match name.as_str() {
            "count" => AggKind::Count,
            "sum" => AggKind::Sum,
            "avg" | "mean" => AggKind::Avg,
            "min" => AggKind::Min,
            "max" => AggKind::Max,
            other => {
                return Err(Error::not_supported(format!(
                    "aggregate function {other}() is not supported in materialized views"
                ))
                .with_hint("Materialized views support COUNT, SUM, AVG, MIN and MAX."))
            }
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
            AggKind::Sum | AggKind::Avg => arg_type.is_numeric(),
        };
        if !supported {
            return Err(Error::new(
                ErrorKind::TypeMismatch,
                format!("function {name}({arg_type}) does not exist"),
            ));
        }
        Ok(AggCall {
            kind,
            arg: self.physical(arg, input_schema)?,
            arg_type,
            output_type,
        })
    }
}

fn has_subquery(e: &Expr) -> bool {
    let mut found = false;
    let _ = e.apply(|e| {
        if matches!(
            e,
            Expr::ScalarSubquery(_) | Expr::InSubquery(_) | Expr::Exists(_)
        ) {
            found = true;
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    found
}

fn unsupported(what: &str, feature: &str) -> Error {
    Error::not_supported(format!(
        "{what} cannot be used in a materialized view yet"
    ))
    .with_hint(format!(
        "Materialized views support projections, filters and GROUP BY aggregates over one table or view; {feature} are planned."
    ))
}
