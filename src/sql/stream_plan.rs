//! Compiles a view's DataFusion logical plan into a `StreamPlan` of incremental operators, or
//! refuses it (SQLSTATE 0A000, with a hint) when Weir cannot maintain it incrementally.

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Schema};
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::DFSchema;
use datafusion::common::{JoinType, NullEquality};
use datafusion::execution::context::SessionState;
use datafusion::logical_expr::{Expr, ExprSchemable, Join, LogicalPlan, Volatility};
use datafusion::physical_plan::PhysicalExpr;

use crate::catalog::{Catalog, ObjectId};
use crate::error::{Error, ErrorKind, Result};
use crate::stream::operators::hash_agg::{AggCall, AggKind};
use crate::stream::operators::join::{JoinKind, JoinSpec};
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

/// What the planner collects while it walks the plan.
#[derive(Default)]
struct Build {
    /// The relation each leaf reads, in leaf order.
    inputs: Vec<ObjectId>,
}

impl Planner<'_> {
    /// Compiles an (optimised) plan. Returns the stream plan and the relations it reads.
    pub fn plan(&self, plan: &LogicalPlan) -> Result<(StreamPlan, Vec<ObjectId>)> {
        let mut build = Build::default();
        let root = self.node(plan, &mut build)?;
        let schema = Arc::new(plan.schema().as_arrow().clone());
        let mut deps = build.inputs.clone();
        deps.sort();
        deps.dedup();
        Ok((
            StreamPlan {
                inputs: build.inputs,
                root,
                schema,
            },
            deps,
        ))
    }

    fn physical(&self, e: &Expr, schema: &DFSchema) -> Result<Arc<dyn PhysicalExpr>> {
        Ok(self.state.create_physical_expr(e.clone(), schema)?)
    }

    fn node(&self, plan: &LogicalPlan, build: &mut Build) -> Result<PlanNode> {
        match plan {
            LogicalPlan::TableScan(scan) => {
                let name = scan.table_name.table();
                let object = self
                    .catalog
                    .get(name)
                    .ok_or_else(|| crate::catalog::undefined_table(name))?;
                let id = object.id();
                if let Some(fetch) = scan.fetch {
                    return Err(unsupported(&format!("LIMIT {fetch}"), "Top-N views"));
                }
                let full = self
                    .catalog
                    .schema(id)
                    .ok_or_else(|| Error::internal(format!("no schema for relation {name}")))?;
                build.inputs.push(id);
                let mut node = PlanNode::Input(build.inputs.len() - 1);
                if !scan.filters.is_empty() {
                    let df = DFSchema::try_from_qualified_schema(scan.table_name.clone(), &full)?;
                    let conj = scan
                        .filters
                        .iter()
                        .cloned()
                        .reduce(Expr::and)
                        .expect("non-empty");
                    node = PlanNode::Filter {
                        input: Box::new(node),
                        predicate: self.physical(&conj, &df)?,
                    };
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
                    node = PlanNode::Project {
                        input: Box::new(node),
                        exprs,
                        schema: Arc::new(scan.projected_schema.as_arrow().clone()),
                    };
                }
                Ok(node)
            }
            LogicalPlan::Projection(p) => {
                let input = self.node(&p.input, build)?;
                let input_schema = p.input.schema();
                let exprs = p
                    .expr
                    .iter()
                    .map(|e| self.physical(e, input_schema))
                    .collect::<Result<Vec<_>>>()?;
                Ok(PlanNode::Project {
                    input: Box::new(input),
                    exprs,
                    schema: Arc::new(p.schema.as_arrow().clone()),
                })
            }
            LogicalPlan::Filter(f) => {
                if f.predicate.contains_outer() || has_subquery(&f.predicate) {
                    return Err(unsupported("this subquery", "more forms of subqueries"));
                }
                let input = self.node(&f.input, build)?;
                Ok(PlanNode::Filter {
                    input: Box::new(input),
                    predicate: self.physical(&f.predicate, f.input.schema())?,
                })
            }
            LogicalPlan::SubqueryAlias(a) => self.node(&a.input, build),
            LogicalPlan::Aggregate(agg) => {
                let input = self.node(&agg.input, build)?;
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
                if calls.len() > AGGREGATES_MAX {
                    return Err(Error::new(
                        ErrorKind::ProgramLimitExceeded,
                        format!(
                            "a materialized view can compute at most {AGGREGATES_MAX} aggregates per GROUP BY"
                        ),
                    ));
                }
                Ok(PlanNode::Aggregate {
                    input: Box::new(input),
                    group_exprs,
                    group_types,
                    calls,
                    schema: Arc::new(output),
                })
            }
            LogicalPlan::Join(join) => self.join(join, build),
            LogicalPlan::Union(u) => {
                let schema = Arc::new(u.schema.as_arrow().clone());
                let inputs = u
                    .inputs
                    .iter()
                    .map(|i| self.node(i, build))
                    .collect::<Result<Vec<_>>>()?;
                Ok(PlanNode::Union { inputs, schema })
            }
            LogicalPlan::Sort(_) => Err(unsupported("ORDER BY", "Top-N views")),
            LogicalPlan::Limit(_) => Err(unsupported("LIMIT and OFFSET", "Top-N views")),
            LogicalPlan::Distinct(_) => Err(unsupported("DISTINCT ON", "more forms of DISTINCT")),
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

    fn join(&self, join: &Join, build: &mut Build) -> Result<PlanNode> {
        let kind = match join.join_type {
            JoinType::Inner => JoinKind::Inner,
            JoinType::Left => JoinKind::Left,
            JoinType::Right => JoinKind::Right,
            JoinType::Full => JoinKind::Full,
            JoinType::LeftSemi => JoinKind::LeftSemi,
            JoinType::RightSemi => JoinKind::RightSemi,
            JoinType::LeftAnti => JoinKind::LeftAnti,
            JoinType::RightAnti => JoinKind::RightAnti,
            JoinType::LeftMark | JoinType::RightMark => {
                return Err(unsupported(
                    "EXISTS or IN inside OR",
                    "more forms of subqueries",
                ))
            }
        };
        if join.null_aware {
            return Err(Error::not_supported(
                "NOT IN (subquery) cannot be used in a materialized view yet",
            )
            .with_hint("Write it as NOT EXISTS, which has no surprises with NULLs."));
        }
        let left_schema = join.left.schema();
        let right_schema = join.right.schema();
        let mut left_keys = Vec::new();
        let mut right_keys = Vec::new();
        let mut key_types = Vec::new();
        for (l, r) in &join.on {
            let lt = l.get_type(left_schema)?;
            let rt = r.get_type(right_schema)?;
            // The keys compare in the left key's type; the planner has made both sides agree.
            if lt != rt && !datafusion::arrow::compute::can_cast_types(&rt, &lt) {
                return Err(Error::new(
                    ErrorKind::TypeMismatch,
                    format!("cannot join {lt} with {rt}"),
                ));
            }
            left_keys.push(self.physical(l, left_schema)?);
            right_keys.push(self.physical(r, right_schema)?);
            key_types.push(lt);
        }
        let pair_schema = left_schema.join(right_schema)?;
        let condition = match &join.filter {
            Some(f) => Some(self.physical(f, &pair_schema)?),
            None => None,
        };
        let left = self.node(&join.left, build)?;
        let right = self.node(&join.right, build)?;
        Ok(PlanNode::Join {
            left: Box::new(left),
            right: Box::new(right),
            spec: JoinSpec {
                kind,
                left_keys,
                right_keys,
                key_types,
                nulls_equal: join.null_equality == NullEquality::NullEqualsNull,
                condition,
                left_schema: Arc::new(left_schema.as_arrow().clone()),
                right_schema: Arc::new(right_schema.as_arrow().clone()),
                schema: Arc::new(join.schema.as_arrow().clone()),
            },
        })
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
            AggKind::Sum | AggKind::Avg => arg_type.is_numeric(),
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
        "Materialized views support projections, filters, joins, UNION ALL and GROUP BY aggregates; {feature} are planned."
    ))
}
