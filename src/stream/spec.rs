//! What the view compiler (`sql::stream_plan`) builds plan nodes from: each operator's spec,
//! the facts the planner decides (keys, types, kinds, schemas), apart from how the operator
//! keeps its state. The planner imports these, never an operator's module.

use std::sync::Arc;

use datafusion::arrow::compute::SortOptions;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::logical_expr::Operator as BinaryOp;
use datafusion::physical_expr::expressions::{BinaryExpr, CastExpr, Column, Literal};
use datafusion::physical_expr::ScalarFunctionExpr;
use datafusion::physical_plan::PhysicalExpr;

// Aggregates (`operators::hash_agg`).

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum AggKind {
    Count,
    Sum,
    Avg,
    Min,
    Max,
    BoolAnd,
    BoolOr,
    /// The final step of a two-step `count`: the sum of the partial counts, 0 over none.
    SumCounts,
}

#[derive(Clone)]
pub struct AggCall {
    pub kind: AggKind,
    pub arg: Arc<dyn PhysicalExpr>,
    /// The type of the argument (as evaluated over the input).
    pub arg_type: DataType,
    /// The type of the result, as the query's plan gives it.
    pub output_type: DataType,
    /// Each distinct value counts once (`count(DISTINCT x)`).
    pub distinct: bool,
    /// Only rows on which this is true count (`FILTER (WHERE ...)`).
    pub filter: Option<Arc<dyn PhysicalExpr>>,
}

/// A GROUP BY: its grouping expressions and aggregate calls, and how its windows close.
#[derive(Clone)]
pub struct AggSpec {
    pub group_exprs: Vec<Arc<dyn PhysicalExpr>>,
    pub group_types: Vec<DataType>,
    pub calls: Vec<AggCall>,
    /// The group columns, then one column per call.
    pub schema: SchemaRef,
    /// EMIT ON WINDOW CLOSE on this grouping column (a window bound with a watermark).
    pub close_on: Option<usize>,
    /// The input only ever inserts (it reads sources through filters, projections, inner
    /// joins and unions): MIN and MAX keep just the extreme, not every value.
    pub append_only: bool,
    /// Emit the changes of the groups changed so far whenever `EARLY_GROUPS` of them have
    /// changed, not only at the barrier: the first step of a window aggregate computed per
    /// slice, so that the next step's work is spread over the epoch rather than all done at
    /// the barrier (`plan::rewrite::slice_aggregate`).
    pub early: bool,
}

// Joins (`operators::join`).

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum JoinKind {
    Inner,
    Left,
    Right,
    Full,
    LeftSemi,
    LeftAnti,
    RightSemi,
    RightAnti,
}

#[derive(Clone)]
pub struct JoinSpec {
    pub kind: JoinKind,
    /// The equi-join keys: expressions over the left input and over the right input.
    pub left_keys: Vec<Arc<dyn PhysicalExpr>>,
    pub right_keys: Vec<Arc<dyn PhysicalExpr>>,
    /// The type both sides' keys are compared in.
    pub key_types: Vec<DataType>,
    /// Whether NULL keys match each other (`IS NOT DISTINCT FROM`, INTERSECT, EXCEPT).
    pub nulls_equal: bool,
    /// The rest of the ON condition, over the left columns followed by the right ones.
    pub condition: Option<Arc<dyn PhysicalExpr>>,
    pub left_schema: SchemaRef,
    pub right_schema: SchemaRef,
    /// The output: left then right columns, or one side's alone for semi and anti joins.
    pub schema: SchemaRef,
}

// Top-N (`operators::top_n`).

/// The window function whose value a per-partition Top-N outputs as its last column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum RankKind {
    RowNumber,
    Rank,
    DenseRank,
}

/// The type and direction of one column of a sort key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderField {
    pub data_type: DataType,
    pub options: SortOptions,
}

#[derive(Clone)]
pub struct TopNSpec {
    pub partition: Vec<Arc<dyn PhysicalExpr>>,
    pub partition_types: Vec<DataType>,
    /// The sort key, with each column's type, direction and NULL placement.
    pub order: Vec<Arc<dyn PhysicalExpr>>,
    pub order_fields: Vec<OrderField>,
    /// Rows (or ranks, for `rank`) before the first one kept.
    pub offset: u64,
    /// How many are kept; all, when `None`.
    pub limit: Option<u64>,
    /// `Some` for the window form: the rank column appended to each row.
    pub rank: Option<RankKind>,
    /// The input only inserts: rows past the limit are deleted, since they can never enter.
    pub append_only: bool,
    pub input_schema: SchemaRef,
    pub schema: SchemaRef,
}

// Temporal filters (`operators::temporal_filter`).

/// How `now` compares with a row's bound `b` while the row is visible.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Visible {
    /// `now < b`: the row expires when `now` reaches `b`.
    Before,
    /// `now <= b`.
    UntilAfter,
    /// `now > b`: the row appears once `now` passes `b`.
    After,
    /// `now >= b`.
    From,
}

#[derive(Clone)]
pub struct TemporalSpec {
    /// The row's time (microseconds since the epoch once cast to a timestamp).
    pub row_time: Arc<dyn PhysicalExpr>,
    /// `b = row_time - offset_us`: the condition was `row_time <op> now() + offset`.
    pub offset_us: i64,
    pub visible: Visible,
    pub schema: SchemaRef,
}

// Tables fed by a connector (`operators::upsert`).

/// A connector table's rows, resolved by primary key: the table's schema, its key's columns,
/// the order its `Materialize` stores the columns in (the key's first) and that state table.
#[derive(Clone)]
pub struct UpsertSpec {
    pub schema: SchemaRef,
    pub key: Vec<usize>,
    pub order: Vec<usize>,
    pub table: crate::state::TableId,
}

// Projections (`operators::project`).

/// The input column `e` is a non-decreasing function of, alone.
pub fn monotonic_in(e: &Arc<dyn PhysicalExpr>) -> Option<usize> {
    if let Some(c) = e.downcast_ref::<Column>() {
        return Some(c.index());
    }
    let is_literal = |e: &Arc<dyn PhysicalExpr>| e.is::<Literal>();
    // A watermark column is a timestamp or timestamptz, each microseconds since 1970 (UTC):
    // a cast between the two keeps the order.
    if let Some(c) = e.downcast_ref::<CastExpr>() {
        if matches!(c.cast_type(), DataType::Timestamp(..)) {
            return monotonic_in(c.expr());
        }
        return None;
    }
    if let Some(b) = e.downcast_ref::<BinaryExpr>() {
        return match b.op() {
            BinaryOp::Plus | BinaryOp::Minus if is_literal(b.right()) => monotonic_in(b.left()),
            BinaryOp::Plus if is_literal(b.left()) => monotonic_in(b.right()),
            _ => None,
        };
    }
    if let Some(f) = e.downcast_ref::<ScalarFunctionExpr>() {
        let args = f.args();
        return match (f.name(), args) {
            ("date_bin", [stride, source, origin]) if is_literal(stride) && is_literal(origin) => {
                monotonic_in(source)
            }
            ("date_bin", [stride, source]) if is_literal(stride) => monotonic_in(source),
            ("date_trunc", [unit, source]) if is_literal(unit) => monotonic_in(source),
            _ => None,
        };
    }
    None
}
