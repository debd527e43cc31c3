//! Filters, and conditions on `now()`, which become temporal filters maintained as time
//! passes.

use std::sync::Arc;

use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::{DFSchema, ScalarValue};
use datafusion::logical_expr::utils::split_conjunction;
use datafusion::logical_expr::{Expr, Operator};

use super::Planner;
use crate::error::{Error, Result};
use crate::sql::context::VIEW_NOW;
use crate::stream::spec::{TemporalSpec, Visible};
use crate::stream::PlanNode;
impl Planner<'_> {
    /// A filter: conditions on `now()` become temporal filters, the rest one plain filter.
    pub(super) fn filter(
        &self,
        input: PlanNode,
        predicate: &Expr,
        schema: &DFSchema,
    ) -> Result<PlanNode> {
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
    pub(super) fn temporal(&self, condition: &Expr, schema: &DFSchema) -> Result<TemporalSpec> {
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
}

pub(super) fn uses_now(e: &Expr) -> bool {
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
