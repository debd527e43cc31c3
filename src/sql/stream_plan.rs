//! Compiles a view's DataFusion logical plan into a `StreamPlan` of incremental operators, or
//! refuses it (SQLSTATE 0A000, with a hint) when Weir cannot maintain it incrementally.

use std::sync::Arc;

use datafusion::arrow::compute::SortOptions;
use datafusion::arrow::datatypes::{DataType, Schema};
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::DFSchema;
use datafusion::common::{Column, ScalarValue};
use datafusion::common::{JoinType, NullEquality};
use datafusion::execution::context::SessionState;
use datafusion::logical_expr::utils::split_conjunction;
use datafusion::logical_expr::{
    Expr, ExprSchemable, FetchType, Filter, Join, LogicalPlan, Operator, SkipType, SortExpr,
    Volatility,
};
use datafusion::physical_expr::PhysicalExprRef;
use datafusion::physical_plan::PhysicalExpr;

use crate::catalog::{Catalog, Object, ObjectId};
use crate::error::{Error, ErrorKind, Result};
use crate::sql::context::VIEW_NOW;
use crate::stream::plan::{PlanNode, StreamPlan};
use crate::stream::spec::{
    monotonic_in, AggCall, AggKind, JoinKind, JoinSpec, OrderField, RankKind, TemporalSpec,
    TopNSpec, Visible,
};
use datafusion::sql::sqlparser::ast;

/// At most this many aggregates per view: state keys number them with one byte.
const AGGREGATES_MAX: usize = 255;

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
        if uses_now(e) {
            return Err(Error::not_supported(
                "now() can only be used in a materialized view's WHERE, compared with a time",
            )
            .with_hint("For example: WHERE ts > now() - INTERVAL '1 hour'."));
        }
        let expr = self.state.create_physical_expr(e.clone(), schema)?;
        super::checked::checked_physical(expr, schema.as_arrow())
    }

    /// A filter: conditions on `now()` become temporal filters, the rest one plain filter.
    fn filter(&self, input: PlanNode, predicate: &Expr, schema: &DFSchema) -> Result<PlanNode> {
        let (temporal, plain): (Vec<&Expr>, Vec<&Expr>) = split_conjunction(predicate)
            .into_iter()
            .partition(|c| uses_now(c));
        let mut node = input;
        if let Some(rest) = plain.into_iter().cloned().reduce(Expr::and) {
            node = PlanNode::Filter {
                input: Box::new(node),
                predicate: self.physical(&rest, schema)?,
            };
        }
        for condition in temporal {
            node = PlanNode::TemporalFilter {
                input: Box::new(node),
                spec: self.temporal(condition, schema)?,
            };
        }
        Ok(node)
    }

    /// Reads `row_time <op> now() [+|- interval]` (either way round).
    fn temporal(&self, condition: &Expr, schema: &DFSchema) -> Result<TemporalSpec> {
        let unsupported = || {
            Error::not_supported(format!(
                "the condition {condition} cannot be maintained as time passes"
            ))
            .with_hint(
                "Compare a time with now() plus or minus a fixed interval: WHERE ts > now() - INTERVAL '1 hour'.",
            )
        };
        let Expr::BinaryExpr(b) = condition else {
            return Err(unsupported());
        };
        let (row, op, now) = if uses_now(&b.right) && !uses_now(&b.left) {
            (b.left.as_ref(), b.op, b.right.as_ref())
        } else if uses_now(&b.left) && !uses_now(&b.right) {
            (
                b.right.as_ref(),
                b.op.swap().ok_or_else(unsupported)?,
                b.left.as_ref(),
            )
        } else {
            return Err(unsupported());
        };
        let offset_us = now_offset(now).ok_or_else(unsupported)?;
        let visible = match op {
            Operator::Gt => Visible::Before,
            Operator::GtEq => Visible::UntilAfter,
            Operator::Lt => Visible::After,
            Operator::LtEq => Visible::From,
            _ => return Err(unsupported()),
        };
        Ok(TemporalSpec {
            row_time: self.physical(row, schema)?,
            offset_us,
            visible,
            schema: Arc::new(schema.as_arrow().clone()),
        })
    }

    fn node(&self, plan: &LogicalPlan, build: &mut Build) -> Result<PlanNode> {
        match plan {
            LogicalPlan::TableScan(scan) => {
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
                    input_schema: Arc::new(input_schema.as_arrow().clone()),
                    schema: Arc::new(p.schema.as_arrow().clone()),
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
                Ok(PlanNode::Aggregate {
                    input: Box::new(input),
                    group_exprs,
                    group_types,
                    calls,
                    schema: Arc::new(output),
                    close_on,
                    append_only,
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
            // A view's rows have no order: ORDER BY without LIMIT changes nothing.
            LogicalPlan::Sort(sort) => match sort.fetch {
                Some(fetch) => self.top_n(&sort.input, &sort.expr, 0, Some(fetch as u64), build),
                None => self.node(&sort.input, build),
            },
            LogicalPlan::Limit(limit) => {
                let (SkipType::Literal(skip), FetchType::Literal(fetch)) =
                    (limit.get_skip_type()?, limit.get_fetch_type()?)
                else {
                    return Err(Error::not_supported(
                        "LIMIT and OFFSET in a materialized view must be constants",
                    ));
                };
                let fetch = fetch.map(|f| f as u64);
                match limit.input.as_ref() {
                    LogicalPlan::Sort(sort) => {
                        self.top_n(&sort.input, &sort.expr, skip as u64, fetch, build)
                    }
                    // Without ORDER BY any rows will do; the row order of state decides.
                    other => self.top_n(other, &[], skip as u64, fetch, build),
                }
            }
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

    /// Whether `node` only ever inserts: sources through filters, projections, inner joins and
    /// unions. (Tables take deletes; aggregates, outer joins, Top-N and temporal filters
    /// retract.)
    fn append_only(&self, node: &PlanNode, build: &Build) -> bool {
        match node {
            PlanNode::Input(i) => matches!(
                self.catalog.by_id(build.inputs[*i]),
                Some(Object::Source(_))
            ),
            PlanNode::Project { input, .. } | PlanNode::Filter { input, .. } => {
                self.append_only(input, build)
            }
            PlanNode::Join { left, right, spec } => {
                spec.kind == JoinKind::Inner
                    && self.append_only(left, build)
                    && self.append_only(right, build)
            }
            PlanNode::Union { inputs, .. } => inputs.iter().all(|i| self.append_only(i, build)),
            PlanNode::Aggregate { .. }
            | PlanNode::TopN { .. }
            | PlanNode::TemporalFilter { .. } => false,
        }
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
            PlanNode::Filter { input, .. } => self.watermark_columns(input, build),
            PlanNode::Aggregate { close_on, .. } => close_on.iter().copied().collect(),
            // Every other kind of node is named, so that a new one is decided here.
            PlanNode::Join { .. }
            | PlanNode::Union { .. }
            | PlanNode::TopN { .. }
            | PlanNode::TemporalFilter { .. } => Vec::new(),
        }
    }

    /// `ORDER BY order LIMIT limit OFFSET offset` over `input`.
    fn top_n(
        &self,
        input: &LogicalPlan,
        order: &[SortExpr],
        offset: u64,
        limit: Option<u64>,
        build: &mut Build,
    ) -> Result<PlanNode> {
        let schema = input.schema();
        let (order, order_fields) = self.sort_keys(order, schema)?;
        // The fetch DataFusion pushes into a scan under a limit is only a hint.
        let node = match input {
            LogicalPlan::TableScan(scan) if scan.fetch.is_some() => {
                let mut scan = scan.clone();
                scan.fetch = None;
                self.node(&LogicalPlan::TableScan(scan), build)?
            }
            other => self.node(other, build)?,
        };
        let arrow = Arc::new(schema.as_arrow().clone());
        Ok(PlanNode::TopN {
            input: Box::new(node),
            spec: TopNSpec {
                partition: vec![],
                partition_types: vec![],
                order,
                order_fields,
                offset,
                limit,
                rank: None,
                input_schema: arrow.clone(),
                schema: arrow,
            },
        })
    }

    fn sort_keys(
        &self,
        order: &[SortExpr],
        schema: &DFSchema,
    ) -> Result<(Vec<PhysicalExprRef>, Vec<OrderField>)> {
        let mut exprs = Vec::new();
        let mut fields = Vec::new();
        for s in order {
            exprs.push(self.physical(&s.expr, schema)?);
            let options = SortOptions {
                descending: !s.asc,
                nulls_first: s.nulls_first,
            };
            fields.push(OrderField {
                data_type: s.expr.get_type(schema)?,
                options,
            });
        }
        Ok((exprs, fields))
    }

    /// A filter such as `rn <= 3` over `ROW_NUMBER() / RANK() / DENSE_RANK() OVER (PARTITION
    /// BY ... ORDER BY ...) AS rn`, possibly through a projection that passes columns on:
    /// compiled into a per-partition Top-N. Other conjuncts of the filter apply after it.
    fn ranked_top_n(&self, filter: &Filter, build: &mut Build) -> Result<Option<PlanNode>> {
        let (window, projection) = match filter.input.as_ref() {
            LogicalPlan::Window(w) => (w, None),
            LogicalPlan::Projection(p) => match p.input.as_ref() {
                LogicalPlan::Window(w) => (w, Some(p)),
                _ => return Ok(None),
            },
            _ => return Ok(None),
        };
        let [Expr::WindowFunction(function)] = window.window_expr.as_slice() else {
            return Ok(None);
        };
        let rank = match function.fun.name() {
            "row_number" => RankKind::RowNumber,
            "rank" => RankKind::Rank,
            "dense_rank" => RankKind::DenseRank,
            _ => return Ok(None),
        };
        // The rank's column: the window's last, or the projection's column that passes it on.
        let window_fields = window.schema.fields().len();
        let (rank_qualifier, rank_field) = window.schema.qualified_field(window_fields - 1);
        let rank_column = Column::new(rank_qualifier.cloned(), rank_field.name());
        let rank_name = match projection {
            None => rank_column.clone(),
            Some(p) => {
                let position = p.expr.iter().position(|e| match e {
                    Expr::Column(c) => *c == rank_column,
                    Expr::Alias(a) => {
                        matches!(a.expr.as_ref(), Expr::Column(c) if *c == rank_column)
                    }
                    _ => false,
                });
                let Some(i) = position else { return Ok(None) };
                let (q, f) = p.schema.qualified_field(i);
                Column::new(q.cloned(), f.name())
            }
        };
        let mut conjuncts = split_conjunction(&filter.predicate);
        let Some((at, limit)) = conjuncts
            .iter()
            .enumerate()
            .find_map(|(i, c)| rank_bound(c, &rank_name).map(|l| (i, l)))
        else {
            return Ok(None);
        };
        conjuncts.remove(at);
        let params = &function.params;
        let input_schema = window.input.schema();
        let partition = params
            .partition_by
            .iter()
            .map(|e| self.physical(e, input_schema))
            .collect::<Result<Vec<_>>>()?;
        let partition_types = params
            .partition_by
            .iter()
            .map(|e| Ok(e.get_type(input_schema)?))
            .collect::<Result<Vec<_>>>()?;
        let (order, order_fields) = self.sort_keys(&params.order_by, input_schema)?;
        let input = self.node(&window.input, build)?;
        let mut node = PlanNode::TopN {
            input: Box::new(input),
            spec: TopNSpec {
                partition,
                partition_types,
                order,
                order_fields,
                offset: 0,
                limit: Some(limit),
                rank: Some(rank),
                input_schema: Arc::new(input_schema.as_arrow().clone()),
                schema: Arc::new(window.schema.as_arrow().clone()),
            },
        };
        if let Some(p) = projection {
            node = PlanNode::Project {
                input: Box::new(node),
                exprs: p
                    .expr
                    .iter()
                    .map(|e| self.physical(e, &window.schema))
                    .collect::<Result<_>>()?,
                input_schema: Arc::new(window.schema.as_arrow().clone()),
                schema: Arc::new(p.schema.as_arrow().clone()),
            };
        }
        if let Some(rest) = conjuncts.into_iter().cloned().reduce(Expr::and) {
            node = PlanNode::Filter {
                input: Box::new(node),
                predicate: self.physical(&rest, filter.input.schema())?,
            };
        }
        Ok(Some(node))
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

/// How many ranks `e` keeps if it bounds the rank column from above: `rn <= n`, `rn < n`,
/// `rn = 1`, or the same written the other way round.
fn rank_bound(e: &Expr, rank: &Column) -> Option<u64> {
    let Expr::BinaryExpr(b) = e else { return None };
    let is_rank = |e: &Expr| matches!(e, Expr::Column(c) if c == rank);
    let literal = |e: &Expr| match e {
        Expr::Literal(v, _) => v.cast_to(&DataType::Int64).ok().and_then(|v| match v {
            ScalarValue::Int64(Some(n)) => Some(n),
            _ => None,
        }),
        _ => None,
    };
    let (op, n) = if is_rank(&b.left) {
        (b.op, literal(&b.right)?)
    } else if is_rank(&b.right) {
        (b.op.swap()?, literal(&b.left)?)
    } else {
        return None;
    };
    let keep = match op {
        Operator::LtEq => n,
        Operator::Lt => n - 1,
        Operator::Eq if n == 1 => 1,
        _ => return None,
    };
    u64::try_from(keep).ok()
}

fn uses_now(e: &Expr) -> bool {
    let mut found = false;
    let _ = e.apply(|e| {
        if matches!(e, Expr::ScalarFunction(f) if f.func.name() == VIEW_NOW) {
            found = true;
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    found
}

/// `now()`, `now() + interval` or `now() - interval` (through casts): the interval in
/// microseconds, which must be of fixed length.
fn now_offset(e: &Expr) -> Option<i64> {
    match e {
        Expr::ScalarFunction(f) if f.func.name() == VIEW_NOW => Some(0),
        Expr::Cast(c) => now_offset(&c.expr),
        Expr::TryCast(c) => now_offset(&c.expr),
        Expr::BinaryExpr(b) if matches!(b.op, Operator::Plus | Operator::Minus) => {
            let base = now_offset(&b.left)?;
            let Expr::Literal(v, _) = b.right.as_ref() else {
                return None;
            };
            let us = match v {
                ScalarValue::IntervalMonthDayNano(Some(i)) if i.months == 0 => {
                    i.days as i64 * 86_400_000_000 + i.nanoseconds / 1000
                }
                ScalarValue::IntervalDayTime(Some(i)) => {
                    i.days as i64 * 86_400_000_000 + i.milliseconds as i64 * 1000
                }
                _ => return None,
            };
            Some(if b.op == Operator::Plus {
                base + us
            } else {
                base - us
            })
        }
        _ => None,
    }
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
