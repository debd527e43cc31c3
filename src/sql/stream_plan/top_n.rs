//! ORDER BY ... LIMIT, LIMIT alone, and ranks kept by ROW_NUMBER, RANK and DENSE_RANK over
//! windows: per-partition Top-N.

use std::sync::Arc;

use datafusion::arrow::compute::SortOptions;
use datafusion::arrow::datatypes::DataType;
use datafusion::common::{Column, DFSchema, ScalarValue};
use datafusion::logical_expr::utils::split_conjunction;
use datafusion::logical_expr::{
    Expr, ExprSchemable, FetchType, Filter, Limit, LogicalPlan, Operator, SkipType, SortExpr,
};
use datafusion::physical_expr::PhysicalExprRef;

use super::{Build, Planner};
use crate::error::{Error, Result};
use crate::stream::spec::{OrderField, RankKind, TopNSpec};
use crate::stream::PlanNode;
impl Planner<'_> {
    /// `LIMIT` and `OFFSET`, over an `ORDER BY` or not: a Top-N.
    pub(super) fn limit(&self, limit: &Limit, build: &mut Build) -> Result<PlanNode> {
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

    /// `ORDER BY order LIMIT limit OFFSET offset` over `input`.
    pub(super) fn top_n(
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
        let append_only = self.append_only(&node, build);
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
                append_only,
                input_schema: arrow.clone(),
                schema: arrow,
            },
        })
    }

    pub(super) fn sort_keys(
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
    pub(super) fn ranked_top_n(
        &self,
        filter: &Filter,
        build: &mut Build,
    ) -> Result<Option<PlanNode>> {
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
        let append_only = self.append_only(&input, build);
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
                append_only,
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
