//! Compiles a view's DataFusion logical plan into a `StreamPlan` of incremental operators, or
//! refuses it (SQLSTATE 0A000, with a hint) when Weir cannot maintain it incrementally.

mod aggregate;
mod join;
mod temporal;
mod top_n;

use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{DFSchema, DataFusionError};
use datafusion::execution::context::SessionState;
use datafusion::logical_expr::{Expr, LogicalPlan, TableScan, Volatility};
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_plan::PhysicalExpr;
use datafusion::sql::sqlparser::ast;

use self::temporal::uses_now;
use crate::catalog::{Catalog, Object, ObjectId};
use crate::error::{Error, Result};
use crate::sql::context::VIEW_NOW;
use crate::stream::spec::{monotonic_in, JoinKind};
use crate::stream::{PlanNode, StreamPlan};

/// Renames `now()` and `current_timestamp` in a view's query to `weir_now()`, which the
/// optimizer does not fold into a constant, so that the compiler can find it (see
/// `context::VIEW_NOW`).
pub fn mark_view_now(stmt: &mut ast::Statement) {
    let _ = ast::visit_expressions_mut(stmt, |e| {
        if let ast::Expr::Function(f) = e {
            let name = f.name.to_string().to_lowercase();
            let no_args = match &f.args {
                ast::FunctionArguments::None => true,
                ast::FunctionArguments::List(l) => l.args.is_empty(),
                ast::FunctionArguments::Subquery(_) => false,
            };
            if (name == "now" || name == "current_timestamp") && no_args {
                f.name = ast::ObjectName::from(vec![ast::Ident::new(VIEW_NOW)]);
                f.args = ast::FunctionArguments::List(ast::FunctionArgumentList {
                    duplicate_treatment: None,
                    args: vec![],
                    clauses: vec![],
                });
            }
        }
        std::ops::ControlFlow::<()>::Continue(())
    });
}

/// Refuses expressions whose value is not a function of the row alone: volatile functions
/// (random()) would make a deletion retract something other than what the insertion added,
/// and other time functions change the result as time passes. `now()` (as `weir_now()`) is
/// left to the compiler, which accepts it only in a temporal filter.
pub fn check_deterministic(plan: &LogicalPlan) -> Result<()> {
    let mut found: Option<String> = None;
    plan.apply_with_subqueries(|node| {
        for e in node.expressions() {
            e.apply(|e| {
                if let Expr::ScalarFunction(f) = e {
                    if f.func.signature().volatility != Volatility::Immutable
                        && f.func.name() != VIEW_NOW
                    {
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
    /// The transaction block the view is created in, whose objects it may read.
    pub scope: crate::catalog::Scope,
    /// The view emits a group's row once, when the watermark closes its window.
    pub emit_on_window_close: bool,
}

/// What the planner collects while it walks the plan.
#[derive(Default)]
struct Build {
    /// The relation each leaf reads, in leaf order.
    inputs: Vec<ObjectId>,
    /// Whether some aggregate closes windows (EMIT ON WINDOW CLOSE).
    closes_windows: bool,
}

impl Planner<'_> {
    /// Compiles an (optimised) plan. Returns the stream plan and the relations it reads.
    pub fn plan(&self, plan: &LogicalPlan) -> Result<(StreamPlan, Vec<ObjectId>)> {
        let mut build = Build::default();
        let root = self.node(plan, &mut build)?;
        if self.emit_on_window_close && !build.closes_windows {
            return Err(no_window_to_close());
        }
        let schema = Arc::new(plan.schema().as_arrow().clone());
        let mut deps = build.inputs.clone();
        deps.sort();
        deps.dedup();
        let key = self.key(&root, &build);
        let append_only = self.emit_on_window_close || self.append_only(&root, &build);
        Ok((
            StreamPlan {
                inputs: build.inputs,
                root,
                schema,
                key,
                append_only,
            },
            deps,
        ))
    }

    fn physical(&self, e: &Expr, schema: &DFSchema) -> Result<Arc<dyn PhysicalExpr>> {
        if uses_now(e) {
            return Err(Error::not_supported(
                "now() can only be used in a materialized view's WHERE, compared with a time",
            )
            .with_hint("For example: WHERE ts > now() - INTERVAL '1 hour'."));
        }
        let expr = self.state.create_physical_expr(e.clone(), schema)?;
        super::checked::checked_physical(expr, schema.as_arrow())
    }

    fn node(&self, plan: &LogicalPlan, build: &mut Build) -> Result<PlanNode> {
        match plan {
            LogicalPlan::TableScan(scan) => self.scan(scan, build),
            LogicalPlan::Projection(p) => {
                let input = self.node(&p.input, build)?;
                let input_schema = p.input.schema();
                let exprs = p
                    .expr
                    .iter()
                    .map(|e| self.physical(e, input_schema))
                    .collect::<Result<Vec<_>>>()?;
                let schema = Arc::new(p.schema.as_arrow().clone());
                Ok(match input {
                    // Over a projection that only reorders columns (an aggregate's groups put
                    // back in the query's order): one projection over what it reads.
                    PlanNode::Project {
                        input,
                        exprs: columns,
                        input_schema,
                        ..
                    } if columns.iter().all(|c| c.downcast_ref::<Column>().is_some()) => {
                        PlanNode::Project {
                            input,
                            exprs: exprs
                                .into_iter()
                                .map(|e| over_columns(e, &columns))
                                .collect::<Result<_>>()?,
                            input_schema,
                            schema,
                        }
                    }
                    input => PlanNode::Project {
                        input: Box::new(input),
                        exprs,
                        input_schema: Arc::new(input_schema.as_arrow().clone()),
                        schema,
                    },
                })
            }
            LogicalPlan::Filter(f) => {
                if let Some(node) = self.ranked_top_n(f, build)? {
                    return Ok(node);
                }
                if f.predicate.contains_outer() || has_subquery(&f.predicate) {
                    return Err(unsupported("this subquery", "more forms of subqueries"));
                }
                let input = self.node(&f.input, build)?;
                self.filter(input, &f.predicate, f.input.schema())
            }
            LogicalPlan::SubqueryAlias(a) => self.node(&a.input, build),
            LogicalPlan::Aggregate(agg) => self.aggregate(agg, build),
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
            // A view's rows have no order: ORDER BY without LIMIT changes nothing.
            LogicalPlan::Sort(sort) => match sort.fetch {
                Some(fetch) => self.top_n(&sort.input, &sort.expr, 0, Some(fetch as u64), build),
                None => self.node(&sort.input, build),
            },
            LogicalPlan::Limit(limit) => self.limit(limit, build),
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

    /// A relation's changes, with the filters and projection pushed into the scan.
    fn scan(&self, scan: &TableScan, build: &mut Build) -> Result<PlanNode> {
        if scan.table_name.schema() == Some(super::context::SYSTEM_SCHEMA) {
            return Err(Error::not_supported(format!(
                "a materialized view cannot read the system table {}",
                scan.table_name
            ))
            .with_hint("Query it directly: its rows are taken when it is read."));
        }
        let name = scan.table_name.table();
        let object = self
            .catalog
            .get(name, self.scope)
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
            node = self.filter(node, &conj, &df)?;
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
                input_schema: full.clone(),
                schema: Arc::new(scan.projected_schema.as_arrow().clone()),
            };
        }
        Ok(node)
    }

    /// Whether `node` only ever inserts: sources through filters, projections, inner joins and
    /// unions. (Tables take deletes; aggregates, outer joins, Top-N and temporal filters
    /// retract.)
    fn append_only(&self, node: &PlanNode, build: &Build) -> bool {
        match node {
            PlanNode::Input(i) => matches!(
                self.catalog.by_id(build.inputs[*i]),
                Some(Object::Source(_))
            ),
            PlanNode::Project { input, .. }
            | PlanNode::Filter { input, .. }
            | PlanNode::Expand { input, .. }
            | PlanNode::Shared { input, .. } => self.append_only(input, build),
            PlanNode::Join { left, right, spec } => {
                spec.kind == JoinKind::Inner
                    && self.append_only(left, build)
                    && self.append_only(right, build)
            }
            PlanNode::Union { inputs, .. } => inputs.iter().all(|i| self.append_only(i, build)),
            PlanNode::Aggregate { .. }
            | PlanNode::TopN { .. }
            | PlanNode::TemporalFilter { .. }
            | PlanNode::Upsert { .. } => false,
        }
    }

    /// Columns of `node`'s output that identify its rows: a table's primary key or a view's
    /// own key, carried through filters and through projections that keep every key column
    /// as it is, and the group columns of a grouped aggregate. `None` where it cannot tell.
    fn key(&self, node: &PlanNode, build: &Build) -> Option<Vec<usize>> {
        let key = match node {
            PlanNode::Input(i) => match self.catalog.by_id(build.inputs[*i])? {
                Object::Table(t) => Some(t.primary_key.clone()),
                Object::View(v) => v.key.clone(),
                Object::Source(_) => None,
            },
            PlanNode::Filter { input, .. } => self.key(input, build),
            PlanNode::Project { input, exprs, .. } => {
                let below = self.key(input, build)?;
                below
                    .iter()
                    .map(|k| {
                        exprs.iter().position(|e| {
                            e.downcast_ref::<Column>().is_some_and(|c| c.index() == *k)
                        })
                    })
                    .collect()
            }
            PlanNode::Aggregate { spec, .. } => Some((0..spec.group_exprs.len()).collect()),
            _ => None,
        };
        key.filter(|k| !k.is_empty())
    }

    /// The output columns of `node` that carry a watermark: a table's watermark column, and
    /// what projections compute from it without breaking its order (see `Project`).
    fn watermark_columns(&self, node: &PlanNode, build: &Build) -> Vec<usize> {
        match node {
            PlanNode::Input(i) => match self.catalog.by_id(build.inputs[*i]) {
                Some(Object::Table(t)) => t.watermark.map(|w| vec![w.column]).unwrap_or_default(),
                Some(Object::Source(s)) => s.watermark.map(|w| vec![w.column]).unwrap_or_default(),
                _ => Vec::new(),
            },
            PlanNode::Project { input, exprs, .. } => {
                let below = self.watermark_columns(input, build);
                exprs
                    .iter()
                    .enumerate()
                    .filter(|(_, e)| monotonic_in(e).is_some_and(|c| below.contains(&c)))
                    .map(|(j, _)| j)
                    .collect()
            }
            PlanNode::Filter { input, .. } | PlanNode::Shared { input, .. } => {
                self.watermark_columns(input, build)
            }
            PlanNode::Aggregate { spec, .. } => spec.close_on.iter().copied().collect(),
            // A union passes a column's watermark once every input gives one, as the least
            // (`operators::union`): a HOP window's copies of a row.
            PlanNode::Union { inputs, .. } => {
                let mut each = inputs.iter().map(|i| self.watermark_columns(i, build));
                let first = each.next().unwrap_or_default();
                each.fold(first, |kept, next| {
                    kept.into_iter().filter(|c| next.contains(c)).collect()
                })
            }
            // Every other kind of node is named, so that a new one is decided here.
            PlanNode::Join { .. }
            | PlanNode::Expand { .. }
            | PlanNode::TopN { .. }
            | PlanNode::TemporalFilter { .. }
            | PlanNode::Upsert { .. } => Vec::new(),
        }
    }
}

/// `expr`, over the output of a projection of `columns`, over that projection's input.
fn over_columns(
    expr: Arc<dyn PhysicalExpr>,
    columns: &[Arc<dyn PhysicalExpr>],
) -> Result<Arc<dyn PhysicalExpr>> {
    Ok(expr
        .transform(|e| match e.downcast_ref::<Column>() {
            Some(c) => match columns.get(c.index()) {
                Some(below) => Ok(Transformed::yes(below.clone())),
                None => Err(DataFusionError::Internal(format!(
                    "column {c} past a projection of {} columns",
                    columns.len()
                ))),
            },
            None => Ok(Transformed::no(e)),
        })?
        .data)
}

fn no_window_to_close() -> Error {
    Error::not_supported(
        "EMIT ON WINDOW CLOSE needs a GROUP BY on a window of a table with a watermark",
    )
    .with_hint(
        "Declare WATERMARK FOR ts AS ts - INTERVAL '...' on the table, and group by window_start of TUMBLE or HOP over it.",
    )
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
