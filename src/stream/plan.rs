//! `StreamPlan`: what `sql/` compiles a view's query into, and how it becomes an actor.
//!
//! A plan is a tree of operators whose leaves are the actor's inputs: each input is the change
//! stream of one relation (a table or view); a relation read twice (a self-join) is two
//! inputs. Unary operators (project, filter, aggregate) have one child, a join two, a union
//! any number.

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::physical_plan::PhysicalExpr;
use tokio::sync::mpsc;

use super::actor::{Actor, OpNode};
use super::align::AlignedInputs;
use super::coordinator::ActorEvent;
use super::dispatch::VnodeMapping;
use super::expr::ErrorSink;
use super::message::{ActorId, Message};
use super::operators::filter::Filter;
use super::operators::hash_agg::{AggCall, HashAgg};
use super::operators::join::{HashJoin, JoinSpec};
use super::operators::materialize::Materialize;
use super::operators::project::Project;
use super::operators::temporal_filter::{TemporalFilter, TemporalSpec};
use super::operators::top_n::{TopN, TopNSpec};
use super::operators::union::Union;
use super::operators::vnode_filter::VnodeFilter;
use crate::error::Result;
use crate::state::{StateStore, TableId};

pub struct StreamPlan {
    /// The relations (table or view ids) feeding the plan; leaf `Input(i)` reads `inputs[i]`.
    pub inputs: Vec<ActorId>,
    pub root: PlanNode,
    /// The schema of the view's rows.
    pub schema: SchemaRef,
}

pub enum PlanNode {
    /// The changes of the plan's input `i`.
    Input(usize),
    Project {
        input: Box<PlanNode>,
        exprs: Vec<Arc<dyn PhysicalExpr>>,
        /// What the expressions read: to carry watermarks through them.
        input_schema: SchemaRef,
        schema: SchemaRef,
    },
    Filter {
        input: Box<PlanNode>,
        predicate: Arc<dyn PhysicalExpr>,
    },
    Aggregate {
        input: Box<PlanNode>,
        group_exprs: Vec<Arc<dyn PhysicalExpr>>,
        group_types: Vec<DataType>,
        calls: Vec<AggCall>,
        schema: SchemaRef,
        /// EMIT ON WINDOW CLOSE on this grouping column (a window bound with a watermark).
        close_on: Option<usize>,
    },
    Join {
        left: Box<PlanNode>,
        right: Box<PlanNode>,
        spec: JoinSpec,
    },
    /// UNION ALL: every input's changes, under the union's schema.
    Union {
        inputs: Vec<PlanNode>,
        schema: SchemaRef,
    },
    TopN {
        input: Box<PlanNode>,
        spec: TopNSpec,
    },
    /// A condition comparing rows with `now()`, maintained as time passes.
    TemporalFilter {
        input: Box<PlanNode>,
        spec: TemporalSpec,
    },
    /// One parallel actor's share of a hash exchange: the rows whose key it owns.
    VnodeFilter {
        input: Box<PlanNode>,
        keys: Vec<Arc<dyn PhysicalExpr>>,
        key_types: Vec<DataType>,
        owner: usize,
        actors: usize,
    },
}

impl PlanNode {
    /// How many state tables this subtree's operators need.
    pub fn state_tables_needed(&self) -> usize {
        match self {
            PlanNode::Input(_) => 0,
            PlanNode::Project { input, .. }
            | PlanNode::Filter { input, .. }
            | PlanNode::VnodeFilter { input, .. } => input.state_tables_needed(),
            PlanNode::TemporalFilter { input, .. } => 1 + input.state_tables_needed(),
            PlanNode::Aggregate { input, .. } | PlanNode::TopN { input, .. } => {
                2 + input.state_tables_needed()
            }
            PlanNode::Join { left, right, .. } => {
                2 + left.state_tables_needed() + right.state_tables_needed()
            }
            PlanNode::Union { inputs, .. } => inputs.iter().map(|i| i.state_tables_needed()).sum(),
        }
    }
}

impl PlanNode {
    /// The operator tree as indented lines, for EXPLAIN; `inputs` names the relations read.
    pub fn explain(&self, depth: usize, inputs: &[String], out: &mut Vec<String>) {
        let list = |exprs: &[Arc<dyn PhysicalExpr>]| {
            exprs
                .iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let line = match self {
            PlanNode::Input(i) => format!(
                "Input: {}",
                inputs.get(*i).map(String::as_str).unwrap_or("?")
            ),
            PlanNode::Project { exprs, .. } => format!("Project: {}", list(exprs)),
            PlanNode::Filter { predicate, .. } => format!("Filter: {predicate}"),
            PlanNode::Aggregate {
                group_exprs,
                calls,
                close_on,
                ..
            } => {
                let calls: Vec<String> = calls
                    .iter()
                    .map(|c| {
                        format!(
                            "{:?}({}{})",
                            c.kind,
                            if c.distinct { "DISTINCT " } else { "" },
                            c.arg
                        )
                    })
                    .collect();
                format!(
                    "HashAgg: group by [{}], aggregates [{}]{}",
                    list(group_exprs),
                    calls.join(", "),
                    if close_on.is_some() {
                        ", emit on window close"
                    } else {
                        ""
                    }
                )
            }
            PlanNode::Join { spec, .. } => {
                let on: Vec<String> = spec
                    .left_keys
                    .iter()
                    .zip(&spec.right_keys)
                    .map(|(l, r)| format!("{l} = {r}"))
                    .collect();
                let condition = spec
                    .condition
                    .as_ref()
                    .map(|c| format!(", condition {c}"))
                    .unwrap_or_default();
                format!(
                    "HashJoin {:?}: on [{}]{condition}",
                    spec.kind,
                    on.join(", ")
                )
            }
            PlanNode::Union { inputs, .. } => format!("Union: {} inputs", inputs.len()),
            PlanNode::TopN { spec, .. } => format!(
                "TopN: partition by [{}], order by [{}], offset {}, limit {}{}",
                list(&spec.partition),
                list(&spec.order),
                spec.offset,
                spec.limit.map_or("none".to_string(), |l| l.to_string()),
                spec.rank.map(|r| format!(", {r:?}")).unwrap_or_default()
            ),
            PlanNode::TemporalFilter { spec, .. } => format!(
                "TemporalFilter: visible {:?} now() vs {} - {} us",
                spec.visible, spec.row_time, spec.offset_us
            ),
            PlanNode::VnodeFilter {
                keys,
                owner,
                actors,
                ..
            } => format!(
                "VnodeFilter: keys [{}], this actor's share ({} of {actors})",
                list(keys),
                owner + 1
            ),
        };
        out.push(format!("{}{line}", "  ".repeat(depth)));
        match self {
            PlanNode::Input(_) => {}
            PlanNode::Project { input, .. }
            | PlanNode::Filter { input, .. }
            | PlanNode::Aggregate { input, .. }
            | PlanNode::TopN { input, .. }
            | PlanNode::TemporalFilter { input, .. }
            | PlanNode::VnodeFilter { input, .. } => input.explain(depth + 1, inputs, out),
            PlanNode::Join { left, right, .. } => {
                left.explain(depth + 1, inputs, out);
                right.explain(depth + 1, inputs, out);
            }
            PlanNode::Union {
                inputs: children, ..
            } => {
                for c in children {
                    c.explain(depth + 1, inputs, out);
                }
            }
        }
    }
}

impl StreamPlan {
    /// How many state tables the plan's operators need besides the view's own Materialize.
    pub fn state_tables_needed(&self) -> usize {
        self.root.state_tables_needed()
    }

    /// Whether the plan can run as parallel actors that each own part of the keys: it has
    /// exactly one stateful operator, partitioned by a key (a grouped aggregate, a join, a
    /// Top-N per partition), and only row-by-row operators besides.
    pub fn partitionable(&self) -> bool {
        fn count(node: &PlanNode) -> Option<usize> {
            let below =
                |inputs: &[&PlanNode]| -> Option<usize> { inputs.iter().map(|n| count(n)).sum() };
            match node {
                PlanNode::Input(_) => Some(0),
                PlanNode::Project { input, .. }
                | PlanNode::Filter { input, .. }
                | PlanNode::TemporalFilter { input, .. }
                | PlanNode::VnodeFilter { input, .. } => count(input),
                PlanNode::Union { inputs, .. } => below(&inputs.iter().collect::<Vec<_>>()),
                PlanNode::Aggregate {
                    input, group_exprs, ..
                } if !group_exprs.is_empty() => Some(1 + count(input)?),
                PlanNode::Join { left, right, spec } if !spec.left_keys.is_empty() => {
                    Some(1 + below(&[left, right])?)
                }
                PlanNode::TopN { input, spec } if !spec.partition.is_empty() => {
                    Some(1 + count(input)?)
                }
                _ => None,
            }
        }
        count(&self.root) == Some(1)
    }

    /// The plan of parallel actor `owner` of `actors`: the keyed operator reads only the rows
    /// whose keys it owns. Call only on a `partitionable` plan.
    pub fn for_actor(mut self, owner: usize, actors: usize) -> StreamPlan {
        fn split(node: PlanNode, owner: usize, actors: usize) -> PlanNode {
            let share = |input: PlanNode, keys: Vec<Arc<dyn PhysicalExpr>>, key_types| {
                Box::new(PlanNode::VnodeFilter {
                    input: Box::new(input),
                    keys,
                    key_types,
                    owner,
                    actors,
                })
            };
            match node {
                PlanNode::Aggregate {
                    input,
                    group_exprs,
                    group_types,
                    calls,
                    schema,
                    close_on,
                } => PlanNode::Aggregate {
                    input: share(*input, group_exprs.clone(), group_types.clone()),
                    group_exprs,
                    group_types,
                    calls,
                    schema,
                    close_on,
                },
                PlanNode::Join { left, right, spec } => PlanNode::Join {
                    left: share(*left, spec.left_keys.clone(), spec.key_types.clone()),
                    right: share(*right, spec.right_keys.clone(), spec.key_types.clone()),
                    spec,
                },
                PlanNode::TopN { input, spec } => PlanNode::TopN {
                    input: share(*input, spec.partition.clone(), spec.partition_types.clone()),
                    spec,
                },
                PlanNode::Project {
                    input,
                    exprs,
                    input_schema,
                    schema,
                } => PlanNode::Project {
                    input: Box::new(split(*input, owner, actors)),
                    exprs,
                    input_schema,
                    schema,
                },
                PlanNode::Filter { input, predicate } => PlanNode::Filter {
                    input: Box::new(split(*input, owner, actors)),
                    predicate,
                },
                PlanNode::TemporalFilter { input, spec } => PlanNode::TemporalFilter {
                    input: Box::new(split(*input, owner, actors)),
                    spec,
                },
                PlanNode::Union { inputs, schema } => PlanNode::Union {
                    inputs: inputs
                        .into_iter()
                        .map(|i| split(i, owner, actors))
                        .collect(),
                    schema,
                },
                other => other,
            }
        }
        self.root = split(self.root, owner, actors);
        self
    }
}

/// Everything an actor needs from the server to run.
pub struct ActorContext {
    pub store: Arc<StateStore>,
    pub events: mpsc::UnboundedSender<ActorEvent>,
    pub chunk_rows_max: usize,
}

/// Builds the actor of a relation: the operators of `root` (just `Input(0)` for a table) in
/// front of the relation's Materialize. `state_tables[0]` is the Materialize's table; the
/// operators take the rest in pre-order. A parallel worker (`schema` `None`) has no
/// Materialize, and its operators take every table.
pub fn build_actor(
    ctx: &ActorContext,
    id: ActorId,
    root: PlanNode,
    schema: Option<SchemaRef>,
    state_tables: &[TableId],
    inputs: Vec<mpsc::Receiver<Message>>,
    errors: ErrorSink,
) -> Result<Actor> {
    let operators_from = if schema.is_some() { 1 } else { 0 };
    let mut tables = state_tables[operators_from..].iter().copied();
    let root = build_node(ctx, root, &mut tables, &errors)?;
    let materialize = match schema {
        Some(schema) => Some(Materialize::new(
            ctx.store.clone(),
            state_tables[0],
            schema,
        )?),
        None => None,
    };
    Ok(Actor {
        id,
        inputs: AlignedInputs::new(inputs),
        root,
        materialize,
        state_tables: state_tables.to_vec(),
        store: ctx.store.clone(),
        events: ctx.events.clone(),
        chunk_rows_max: ctx.chunk_rows_max,
        outputs: Vec::new(),
        watermarks: Vec::new(),
    })
}

fn build_node(
    ctx: &ActorContext,
    node: PlanNode,
    tables: &mut impl Iterator<Item = TableId>,
    errors: &ErrorSink,
) -> Result<OpNode> {
    Ok(match node {
        PlanNode::Input(i) => OpNode::Input(i),
        PlanNode::Project {
            input,
            exprs,
            input_schema,
            schema,
        } => OpNode::unary(
            Box::new(Project::new(exprs, input_schema, schema, errors.clone())),
            build_node(ctx, *input, tables, errors)?,
        ),
        PlanNode::Filter { input, predicate } => OpNode::unary(
            Box::new(Filter::new(predicate, errors.clone())),
            build_node(ctx, *input, tables, errors)?,
        ),
        PlanNode::Aggregate {
            input,
            group_exprs,
            group_types,
            calls,
            schema,
            close_on,
        } => {
            let groups = next_table(tables);
            let extremes = next_table(tables);
            let agg = HashAgg::new(
                ctx.store.clone(),
                groups,
                extremes,
                group_exprs,
                group_types,
                calls,
                schema,
                close_on,
                errors.clone(),
            )?;
            OpNode::unary(Box::new(agg), build_node(ctx, *input, tables, errors)?)
        }
        PlanNode::Join { left, right, spec } => {
            let sides = [next_table(tables), next_table(tables)];
            let join = HashJoin::new(ctx.store.clone(), sides, spec, errors.clone())?;
            let left = build_node(ctx, *left, tables, errors)?;
            let right = build_node(ctx, *right, tables, errors)?;
            OpNode::Op {
                op: Box::new(join),
                inputs: vec![left, right],
            }
        }
        PlanNode::TopN { input, spec } => {
            let own = [next_table(tables), next_table(tables)];
            let top_n = TopN::new(ctx.store.clone(), own, spec, errors.clone())?;
            OpNode::unary(Box::new(top_n), build_node(ctx, *input, tables, errors)?)
        }
        PlanNode::TemporalFilter { input, spec } => {
            let table = next_table(tables);
            let filter = TemporalFilter::new(ctx.store.clone(), table, spec, errors.clone())?;
            OpNode::unary(Box::new(filter), build_node(ctx, *input, tables, errors)?)
        }
        PlanNode::VnodeFilter {
            input,
            keys,
            key_types,
            owner,
            actors,
        } => OpNode::unary(
            Box::new(VnodeFilter::new(
                keys,
                key_types,
                VnodeMapping::new(actors),
                owner,
                errors.clone(),
            )),
            build_node(ctx, *input, tables, errors)?,
        ),
        PlanNode::Union { inputs, schema } => OpNode::Op {
            op: Box::new(Union::new(schema, inputs.len())),
            inputs: inputs
                .into_iter()
                .map(|i| build_node(ctx, i, tables, errors))
                .collect::<Result<_>>()?,
        },
    })
}

fn next_table(tables: &mut impl Iterator<Item = TableId>) -> TableId {
    tables
        .next()
        .expect("state tables allocated for every operator")
}
