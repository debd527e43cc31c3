//! Rewrites of a view's plan before it is cut into fragments: copies of the same rows read
//! once (`share_reads`), aggregates over window copies computed per slice first
//! (`slice_aggregate`), and global aggregates and Top-N in two steps (`two_step`).

use std::collections::BTreeSet;
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::error::DataFusionError;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::utils::collect_columns;
use datafusion::physical_plan::PhysicalExpr;

use super::PlanNode;
use crate::error::Result;
use crate::stream::dispatch::VnodeOf;
use crate::stream::message::ActorId;
use crate::stream::spec::{AggCall, AggKind, AggSpec, TopNSpec};

/// Rewrites every `UNION ALL` of projections of the same rows (the same relations through the
/// same filters and projections: a `HOP` window's copies of each row) into one `Expand` that
/// reads them once, and then every aggregate over such copies that `slice_aggregate` can
/// split. `inputs` are the relations the plan's leaves read.
pub(super) fn share_reads(node: PlanNode, inputs: &[ActorId]) -> Result<PlanNode> {
    let node = node.try_map_children(&mut |c| share_reads(c, inputs), &mut |i| {
        Ok(PlanNode::Input(i))
    })?;
    Ok(match node {
        PlanNode::Union {
            inputs: branches,
            schema,
        } => expand(branches, schema, inputs),
        PlanNode::Aggregate { input, spec } => match *input {
            PlanNode::Expand {
                input,
                projections,
                input_schema,
                schema,
            } => slice_aggregate(*input, projections, input_schema, schema, spec)?,
            input => PlanNode::Aggregate {
                input: Box::new(input),
                spec,
            },
        },
        other => other,
    })
}

/// The branches of a union as one `Expand`, when each is a projection of the same rows; the
/// union as it was otherwise.
fn expand(branches: Vec<PlanNode>, schema: SchemaRef, inputs: &[ActorId]) -> PlanNode {
    let shared = branches.len() > 1
        && branches.iter().all(|b| match (b, &branches[0]) {
            (
                PlanNode::Project {
                    input,
                    input_schema,
                    ..
                },
                PlanNode::Project {
                    input: first,
                    input_schema: first_schema,
                    ..
                },
            ) => input_schema == first_schema && same_rows(input, first, inputs),
            _ => false,
        });
    if !shared {
        return PlanNode::Union {
            inputs: branches,
            schema,
        };
    }
    let mut read = None;
    let mut projections = Vec::with_capacity(branches.len());
    for branch in branches {
        if let PlanNode::Project {
            input,
            exprs,
            input_schema,
            ..
        } = branch
        {
            projections.push(exprs);
            read.get_or_insert((input, input_schema));
        }
    }
    match read {
        Some((input, input_schema)) => PlanNode::Expand {
            input,
            projections,
            input_schema,
            schema,
        },
        None => PlanNode::Union {
            inputs: Vec::new(),
            schema,
        },
    }
}

/// Whether two subtrees give the same rows: the same relations through the same filters and
/// projections (conservatively: any other operator gives no).
fn same_rows(a: &PlanNode, b: &PlanNode, inputs: &[ActorId]) -> bool {
    match (a, b) {
        (PlanNode::Input(i), PlanNode::Input(j)) => {
            inputs.get(*i).is_some() && inputs.get(*i) == inputs.get(*j)
        }
        (
            PlanNode::Project {
                input: a,
                exprs: ea,
                input_schema: sa,
                ..
            },
            PlanNode::Project {
                input: b,
                exprs: eb,
                input_schema: sb,
                ..
            },
        ) => ea == eb && sa == sb && same_rows(a, b, inputs),
        (
            PlanNode::Filter {
                input: a,
                predicate: pa,
            },
            PlanNode::Filter {
                input: b,
                predicate: pb,
            },
        ) => pa == pb && same_rows(a, b, inputs),
        _ => false,
    }
}

/// An aggregate over the copies an `Expand` makes of each row (a `HOP` window's), computed
/// per slice first: when the copies differ only in columns that are each a constant function
/// of one common part (`date_bin(slide, ts) - i * slide` of the slice `date_bin(slide, ts)`),
/// and the aggregate's calls read none of those columns, a first aggregate groups the rows by
/// those common parts (each row once), the `Expand` makes its copies of the first
/// aggregate's results, and the aggregate combines them (counts are summed). Each row then
/// costs one group update instead of one per copy. Otherwise the aggregate reads the copies
/// as they are.
fn slice_aggregate(
    rows: PlanNode,
    projections: Vec<Vec<Arc<dyn PhysicalExpr>>>,
    rows_schema: SchemaRef,
    copies_schema: SchemaRef,
    spec: AggSpec,
) -> Result<PlanNode> {
    let Some(slices) = Slices::find(&projections, &spec, &rows_schema)? else {
        return Ok(PlanNode::Aggregate {
            input: Box::new(PlanNode::Expand {
                input: Box::new(rows),
                projections,
                input_schema: rows_schema,
                schema: copies_schema,
            }),
            spec,
        });
    };
    let (first, first_schema, partials) =
        first_step(rows, &slices, &projections, &spec, &rows_schema)?;
    // The copies of each first-step result: the grouped columns of each copy, over the common
    // parts, and the partial results.
    let cores = slices.cores.len();
    let copies =
        projections
            .iter()
            .map(|projection| {
                let mut exprs = slices
                    .grouped
                    .iter()
                    .map(|&j| over_cores(&projection[j], &slices.cores))
                    .collect::<Result<Vec<_>>>()?;
                exprs.extend(partials.iter().enumerate().map(|(i, f)| {
                    Arc::new(Column::new(f.name(), cores + i)) as Arc<dyn PhysicalExpr>
                }));
                Ok(exprs)
            })
            .collect::<Result<Vec<_>>>()?;
    let mut copy_fields: Vec<Field> = slices
        .grouped
        .iter()
        .map(|&j| copies_schema.field(j).clone().with_nullable(true))
        .collect();
    copy_fields.extend(partials.iter().cloned());
    let copy_schema = Arc::new(Schema::new(copy_fields));
    // The aggregate itself, over the copies: its groups' columns where the copies put them,
    // each call combining the partial results.
    let position = |j: usize| slices.grouped.iter().position(|&g| g == j);
    let group_exprs = spec
        .group_exprs
        .iter()
        .map(|g| remap_columns(g, &position))
        .collect::<Result<Vec<_>>>()?;
    let calls = spec
        .calls
        .iter()
        .enumerate()
        .map(|(i, c)| combining(c, partials[i].name(), slices.grouped.len() + i))
        .collect();
    Ok(PlanNode::Aggregate {
        input: Box::new(PlanNode::Expand {
            input: Box::new(first),
            projections: copies,
            input_schema: first_schema,
            schema: copy_schema,
        }),
        spec: AggSpec {
            group_exprs,
            calls,
            // The first step's results change: the copies of them are not append-only.
            append_only: false,
            ..spec
        },
    })
}

/// The first step of a sliced aggregate: the rows grouped by the common parts, each call
/// over its argument below the projection (the same in every copy). Returns it, its schema
/// and the fields of its partial results.
fn first_step(
    rows: PlanNode,
    slices: &Slices,
    projections: &[Vec<Arc<dyn PhysicalExpr>>],
    spec: &AggSpec,
    rows_schema: &SchemaRef,
) -> Result<(PlanNode, SchemaRef, Vec<Field>)> {
    let mut fields: Vec<Field> = slices
        .cores
        .iter()
        .enumerate()
        .map(|(k, core)| {
            Ok(Field::new(
                format!("slice_{k}"),
                core.data_type(rows_schema)?,
                true,
            ))
        })
        .collect::<Result<_>>()?;
    let partials: Vec<Field> = spec
        .calls
        .iter()
        .enumerate()
        .map(|(i, c)| Field::new(format!("partial_{i}"), c.output_type.clone(), true))
        .collect();
    fields.extend(partials.iter().cloned());
    let first_schema = Arc::new(Schema::new(fields));
    let first_calls = spec
        .calls
        .iter()
        .map(|c| {
            Ok(AggCall {
                arg: below_projection(&c.arg, &projections[0])?,
                filter: c
                    .filter
                    .as_ref()
                    .map(|f| below_projection(f, &projections[0]))
                    .transpose()?,
                ..c.clone()
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let first = PlanNode::Aggregate {
        input: Box::new(rows),
        spec: AggSpec {
            group_types: slices
                .cores
                .iter()
                .map(|c| c.data_type(rows_schema))
                .collect::<std::result::Result<_, _>>()?,
            group_exprs: slices.cores.clone(),
            calls: first_calls,
            schema: first_schema.clone(),
            close_on: None,
            append_only: spec.append_only,
            early: true,
        },
    };
    Ok((first, first_schema, partials))
}

/// How an aggregate over an `Expand`'s copies splits (`slice_aggregate`).
struct Slices {
    /// The columns of the copies that the aggregate's groups read, in order.
    grouped: Vec<usize>,
    /// The common parts of those columns over the rows, each once.
    cores: Vec<Arc<dyn PhysicalExpr>>,
}

impl Slices {
    fn find(
        projections: &[Vec<Arc<dyn PhysicalExpr>>],
        spec: &AggSpec,
        rows_schema: &Schema,
    ) -> Result<Option<Slices>> {
        let combinable = |c: &AggCall| {
            !c.distinct
                && matches!(
                    c.kind,
                    AggKind::Count
                        | AggKind::SumCounts
                        | AggKind::Sum
                        | AggKind::Min
                        | AggKind::Max
                        | AggKind::BoolAnd
                        | AggKind::BoolOr
                )
        };
        if projections.len() < 2
            || spec.close_on.is_some()
            || spec.group_exprs.is_empty()
            || !spec.calls.iter().all(combinable)
        {
            return Ok(None);
        }
        let width = projections[0].len();
        if projections.iter().any(|p| p.len() != width) {
            return Ok(None);
        }
        let varies = |j: usize| projections.iter().any(|p| !same(&p[j], &projections[0][j]));
        // Each call must see the same values in every copy of a row.
        let read_by_calls = spec
            .calls
            .iter()
            .flat_map(|c| std::iter::once(&c.arg).chain(c.filter.as_ref()))
            .flat_map(collect_columns);
        if read_by_calls
            .into_iter()
            .any(|c| c.index() >= width || varies(c.index()))
        {
            return Ok(None);
        }
        let grouped: Vec<usize> = spec
            .group_exprs
            .iter()
            .flat_map(collect_columns)
            .map(|c| c.index())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let mut cores: Vec<Arc<dyn PhysicalExpr>> = Vec::new();
        for &j in &grouped {
            if j >= width {
                return Ok(None);
            }
            let column: Vec<&Arc<dyn PhysicalExpr>> = projections.iter().map(|p| &p[j]).collect();
            let Some(core) = common_core(&column) else {
                return Ok(None);
            };
            if !cores.iter().any(|c| same(c, &core)) {
                cores.push(core);
            }
        }
        // Grouping by a part that has no column in it would put every row in one group: the
        // copies are then better aggregated as they are.
        if cores.iter().any(|c| collect_columns(c).is_empty()) {
            return Ok(None);
        }
        // The common parts are evaluated over the rows: their types must be known there.
        if cores.iter().any(|c| c.data_type(rows_schema).is_err()) {
            return Ok(None);
        }
        Ok(Some(Slices { grouped, cores }))
    }
}

/// The part all of `exprs` share that every column they read is in: each is that part under
/// constants (`date_bin(slide, ts) - INTERVAL '4s'` and `date_bin(slide, ts) - INTERVAL '2s'`
/// share `date_bin(slide, ts)`). `None` when there is no such part.
fn common_core(exprs: &[&Arc<dyn PhysicalExpr>]) -> Option<Arc<dyn PhysicalExpr>> {
    let mut level: Vec<Arc<dyn PhysicalExpr>> = exprs.iter().map(|e| Arc::clone(e)).collect();
    loop {
        let first = level.first()?.clone();
        if level.iter().all(|e| same(e, &first)) {
            return Some(first);
        }
        // Down the one child that reads columns, the same one in every expression; the
        // other children are constants.
        let mut next = Vec::with_capacity(level.len());
        let mut at = None;
        for e in &level {
            let kids = e.children();
            let mut reading = kids
                .iter()
                .enumerate()
                .filter(|(_, k)| !collect_columns(k).is_empty());
            let (p, kid) = reading.next()?;
            if reading.next().is_some() || *at.get_or_insert(p) != p {
                return None;
            }
            next.push(Arc::clone(*kid));
        }
        level = next;
    }
}

fn same(a: &Arc<dyn PhysicalExpr>, b: &Arc<dyn PhysicalExpr>) -> bool {
    a.as_ref() == b.as_ref()
}

/// `expr` with each of `cores` in it replaced by the column of the first step that holds it.
fn over_cores(
    expr: &Arc<dyn PhysicalExpr>,
    cores: &[Arc<dyn PhysicalExpr>],
) -> Result<Arc<dyn PhysicalExpr>> {
    Ok(expr
        .clone()
        .transform_down(|e: Arc<dyn PhysicalExpr>| {
            Ok(match cores.iter().position(|c| same(c, &e)) {
                Some(k) => Transformed::yes(
                    Arc::new(Column::new(&format!("slice_{k}"), k)) as Arc<dyn PhysicalExpr>
                ),
                None => Transformed::no(e),
            })
        })?
        .data)
}

/// `expr` with each column `j` read at `position(j)`.
fn remap_columns(
    expr: &Arc<dyn PhysicalExpr>,
    position: &dyn Fn(usize) -> Option<usize>,
) -> Result<Arc<dyn PhysicalExpr>> {
    Ok(expr
        .clone()
        .transform_up(
            |e: Arc<dyn PhysicalExpr>| match e.downcast_ref::<Column>() {
                Some(c) => {
                    position(c.index())
                        .map(|p| {
                            Transformed::yes(
                                Arc::new(Column::new(c.name(), p)) as Arc<dyn PhysicalExpr>
                            )
                        })
                        .ok_or_else(|| DataFusionError::Internal("group column not carried".into()))
                }
                None => Ok(Transformed::no(e)),
            },
        )?
        .data)
}

/// The call that combines `call`'s partial results, read from column `index` (`name`):
/// counts are summed, the other kinds combine as themselves.
fn combining(call: &AggCall, name: &str, index: usize) -> AggCall {
    AggCall {
        kind: match call.kind {
            AggKind::Count => AggKind::SumCounts,
            k => k,
        },
        arg: Arc::new(Column::new(name, index)),
        arg_type: call.output_type.clone(),
        output_type: call.output_type.clone(),
        distinct: false,
        filter: None,
    }
}

/// `expr` over the output of a projection computing `exprs`, rewritten over its input.
pub(super) fn below_projection(
    expr: &Arc<dyn PhysicalExpr>,
    exprs: &[Arc<dyn PhysicalExpr>],
) -> Result<Arc<dyn PhysicalExpr>> {
    Ok(expr
        .clone()
        .transform_up(
            |e: Arc<dyn PhysicalExpr>| match e.downcast_ref::<Column>() {
                Some(c) => exprs
                    .get(c.index())
                    .cloned()
                    .map(Transformed::yes)
                    .ok_or_else(|| DataFusionError::Internal("column outside projection".into())),
                None => Ok(Transformed::no(e)),
            },
        )?
        .data)
}

/// Rewrites every global aggregate and global Top-N that can run in two steps into a final
/// step over a partial one. The partial step is keyed by the virtual node of its whole input
/// row, so it runs in a parallel fragment, each actor over its share of the rows; the final
/// step, in one actor, combines at most a few changes per virtual node and epoch.
pub(super) fn two_step(node: PlanNode) -> Result<PlanNode> {
    let node = node.try_map_children(&mut two_step, &mut |i| Ok(PlanNode::Input(i)))?;
    Ok(match node {
        PlanNode::Aggregate { input, spec }
            if spec.group_exprs.is_empty()
            && spec.close_on.is_none()
            // avg needs its sum and count carried apart; DISTINCT needs every value in one
            // place.
            && spec.calls
                .iter()
                .all(|c| !c.distinct && c.kind != AggKind::Avg) =>
        {
            match partial_aggregate(*input, &spec.calls, spec.append_only)? {
                Ok(partial) => {
                    let finals = spec
                        .calls
                        .iter()
                        .enumerate()
                        .map(|(i, c)| combining(c, &format!("partial_{i}"), i + 1))
                        .collect();
                    // The partial step's results change: the final step's input is not
                    // append-only.
                    PlanNode::Aggregate {
                        input: Box::new(partial),
                        spec: AggSpec {
                            calls: finals,
                            append_only: false,
                            ..spec
                        },
                    }
                }
                Err(input) => PlanNode::Aggregate {
                    input: Box::new(input),
                    spec,
                },
            }
        }
        PlanNode::TopN { input, spec }
            if spec.partition.is_empty() && spec.rank.is_none() && spec.limit.is_some() =>
        {
            let Some(kept) = spec.limit.and_then(|l| l.checked_add(spec.offset)) else {
                return Ok(PlanNode::TopN { input, spec });
            };
            let local = TopNSpec {
                partition: vec![Arc::new(VnodeOf::of_row(&spec.input_schema))],
                partition_types: vec![DataType::Int32],
                offset: 0,
                limit: Some(kept),
                ..spec.clone()
            };
            // The global step reads the local one, which retracts.
            PlanNode::TopN {
                input: Box::new(PlanNode::TopN { input, spec: local }),
                spec: TopNSpec {
                    append_only: false,
                    ..spec
                },
            }
        }
        other => other,
    })
}

/// The partial step of a global aggregate over `input`: grouped by the vnode of the input
/// row, computing each call's partial result (`partial_i`, after the `vnode` column). A
/// projection right below is folded into the calls, so that the rows are spread by the
/// relation's whole rows (`count(*)` projects no column at all). `Err(input)` when the
/// input's columns are not known here.
fn partial_aggregate(
    input: PlanNode,
    calls: &[AggCall],
    append_only: bool,
) -> Result<std::result::Result<PlanNode, PlanNode>> {
    let (input, row_schema, calls) = match input {
        PlanNode::Project {
            input,
            exprs,
            input_schema,
            ..
        } => {
            let calls = calls
                .iter()
                .map(|c| {
                    Ok(AggCall {
                        arg: below_projection(&c.arg, &exprs)?,
                        filter: c
                            .filter
                            .as_ref()
                            .map(|f| below_projection(f, &exprs))
                            .transpose()?,
                        ..c.clone()
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            (*input, input_schema, calls)
        }
        other => match other.schema() {
            Some(schema) => (other, schema, calls.to_vec()),
            None => return Ok(Err(other)),
        },
    };
    let mut fields = vec![Field::new("vnode", DataType::Int32, false)];
    fields.extend(
        calls
            .iter()
            .enumerate()
            .map(|(i, c)| Field::new(format!("partial_{i}"), c.output_type.clone(), true)),
    );
    Ok(Ok(PlanNode::Aggregate {
        input: Box::new(input),
        spec: AggSpec {
            group_exprs: vec![Arc::new(VnodeOf::of_row(&row_schema))],
            group_types: vec![DataType::Int32],
            calls,
            schema: Arc::new(Schema::new(fields)),
            close_on: None,
            append_only,
            early: false,
        },
    }))
}

#[cfg(test)]
mod tests {
    use datafusion::physical_expr::expressions::col;

    use super::super::StreamPlan;
    use super::*;
    use crate::stream::chunk::test_util::schema;

    /// `SELECT a FROM t UNION ALL SELECT b FROM t`, the union's branches reading `inputs`.
    fn copies(inputs: Vec<ActorId>) -> StreamPlan {
        let t = schema(&[("a", DataType::Int64), ("b", DataType::Int64)]);
        let out = schema(&[("x", DataType::Int64)]);
        let branch = |i: usize, c: &str| PlanNode::Project {
            input: Box::new(PlanNode::Input(i)),
            exprs: vec![col(c, &t).unwrap()],
            input_schema: t.clone(),
            schema: out.clone(),
        };
        StreamPlan {
            inputs,
            root: PlanNode::Union {
                inputs: vec![branch(0, "a"), branch(1, "b")],
                schema: out.clone(),
            },
            schema: out,
            key: None,
            append_only: true,
        }
    }

    fn root_kind(mut fragments: Vec<super::super::Fragment>) -> &'static str {
        match fragments.remove(0).root {
            PlanNode::Expand { .. } => "expand",
            PlanNode::Union { .. } => "union",
            _ => "other",
        }
    }

    #[test]
    fn copies_of_one_relation_are_read_once_unless_cut_as_before_plan_format_2() {
        assert_eq!(
            root_kind(copies(vec![7, 7]).fragments(1).unwrap()),
            "expand"
        );
        assert_eq!(root_kind(copies(vec![7, 8]).fragments(1).unwrap()), "union");
        assert_eq!(
            root_kind(copies(vec![7, 7]).fragments_unshared(1).unwrap()),
            "union"
        );
    }
}
