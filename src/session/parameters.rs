//! The types of a statement's parameters: what DataFusion inferred from where each is used
//! (`id = $1`), else from the cast around it (`$1::int`, `CAST($1 AS bigint)`) or its clause
//! (`LIMIT $1`, `OFFSET $1` are `bigint`), as PostgreSQL infers them; text where nothing tells.

use std::collections::HashMap;

use datafusion::arrow::datatypes::DataType;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::logical_expr::{Expr, LogicalPlan};

use crate::error::{Error, ErrorKind, Result};

/// The most parameters a statement can have: a Bind message counts its values in 16 bits.
pub const PARAMETERS_MAX: usize = 65_535;

/// The types of `$1, $2, ...`.
pub fn parameter_types(plan: &LogicalPlan) -> Result<Vec<DataType>> {
    let types = plan.get_parameter_types()?;
    let from_context = from_casts_and_limits(plan)?;
    let mut numbered: Vec<(usize, DataType)> = Vec::new();
    for (name, t) in types {
        let n = match name.strip_prefix('$').map(str::parse::<u64>) {
            Some(Ok(0)) => {
                return Err(Error::new(
                    ErrorKind::UndefinedParameter,
                    "there is no parameter $0",
                ))
            }
            Some(Ok(n)) if n <= PARAMETERS_MAX as u64 => n as usize,
            Some(Ok(n)) => {
                return Err(Error::new(
                    ErrorKind::ProgramLimitExceeded,
                    format!(
                        "parameter ${n} is past the most a statement can have \
                         ({PARAMETERS_MAX})"
                    ),
                ))
            }
            _ => return Err(Error::syntax(format!("bad parameter name {name}"))),
        };
        let t = t.or_else(|| from_context.get(&name).cloned());
        numbered.push((n, t.unwrap_or(DataType::Utf8)));
    }
    numbered.sort_by_key(|(n, _)| *n);
    let count = numbered.last().map(|(n, _)| *n).unwrap_or(0);
    let mut out = vec![DataType::Utf8; count];
    for (n, t) in numbered {
        out[n - 1] = t;
    }
    Ok(out)
}

/// The types of the parameters DataFusion leaves untyped that a cast or LIMIT/OFFSET types.
fn from_casts_and_limits(plan: &LogicalPlan) -> Result<HashMap<String, DataType>> {
    let mut found = HashMap::new();
    let untyped = |e: &Expr| match e {
        Expr::Placeholder(p) if p.field.is_none() => Some(p.id.clone()),
        _ => None,
    };
    plan.apply_with_subqueries(|node| {
        if let LogicalPlan::Limit(limit) = node {
            for e in limit.skip.iter().chain(&limit.fetch) {
                if let Some(id) = untyped(e) {
                    found.entry(id).or_insert(DataType::Int64);
                }
            }
        }
        node.apply_expressions(|e| {
            e.apply(|e| {
                let cast = match e {
                    Expr::Cast(c) => Some((&c.expr, c.field.data_type())),
                    Expr::TryCast(c) => Some((&c.expr, c.field.data_type())),
                    _ => None,
                };
                if let Some((id, t)) = cast.and_then(|(inner, t)| Some((untyped(inner)?, t))) {
                    found.entry(id).or_insert_with(|| t.clone());
                }
                Ok(TreeNodeRecursion::Continue)
            })
        })
    })?;
    Ok(found)
}
