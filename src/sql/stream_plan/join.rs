//! Joins: equi-join keys, the rest of the ON condition, and each kind of join.

use std::sync::Arc;

use datafusion::common::{JoinType, NullEquality};
use datafusion::logical_expr::{ExprSchemable, Join};

use super::{unsupported, Build, Planner};
use crate::error::{Error, ErrorKind, Result};
use crate::stream::spec::{JoinKind, JoinSpec};
use crate::stream::PlanNode;
impl Planner<'_> {
    pub(super) fn join(&self, join: &Join, build: &mut Build) -> Result<PlanNode> {
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
}
