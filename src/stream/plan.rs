//! `StreamPlan`: what `sql/` compiles a view's query into, and how it becomes an actor.
//!
//! For now a plan is a chain of operators over one input relation; joins will make it a DAG
//! of fragments.

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::physical_plan::PhysicalExpr;
use tokio::sync::mpsc;

use super::actor::Actor;
use super::align::AlignedInputs;
use super::coordinator::ActorEvent;
use super::expr::ErrorSink;
use super::message::{ActorId, Message};
use super::operator::Operator;
use super::operators::filter::Filter;
use super::operators::hash_agg::{AggCall, HashAgg};
use super::operators::materialize::Materialize;
use super::operators::project::Project;
use crate::error::Result;
use crate::state::{StateStore, TableId};

pub struct StreamPlan {
    /// The relation (table or view) whose changes feed the plan.
    pub input: ActorId,
    pub nodes: Vec<PlanNode>,
    /// The schema of the view's rows.
    pub schema: SchemaRef,
}

pub enum PlanNode {
    Project {
        exprs: Vec<Arc<dyn PhysicalExpr>>,
        schema: SchemaRef,
    },
    Filter {
        predicate: Arc<dyn PhysicalExpr>,
    },
    Aggregate {
        group_exprs: Vec<Arc<dyn PhysicalExpr>>,
        group_types: Vec<DataType>,
        calls: Vec<AggCall>,
        schema: SchemaRef,
    },
}

impl StreamPlan {
    /// How many state tables the plan's operators need besides the view's own Materialize.
    pub fn state_tables_needed(&self) -> usize {
        self.nodes
            .iter()
            .map(|n| match n {
                PlanNode::Aggregate { .. } => 2,
                _ => 0,
            })
            .sum()
    }
}

/// Everything an actor needs from the server to run.
pub struct ActorContext {
    pub store: Arc<StateStore>,
    pub events: mpsc::UnboundedSender<ActorEvent>,
    pub chunk_rows_max: usize,
}

/// Builds the actor of a relation: the operators of `nodes` (empty for a table) in front of
/// the relation's Materialize. `state_tables[0]` is the Materialize's table; the operators
/// take the rest in order.
pub fn build_actor(
    ctx: &ActorContext,
    id: ActorId,
    nodes: Vec<PlanNode>,
    schema: SchemaRef,
    state_tables: &[TableId],
    input: mpsc::Receiver<Message>,
    errors: ErrorSink,
) -> Result<Actor> {
    let mut tables = state_tables[1..].iter().copied();
    let mut chain: Vec<Box<dyn Operator>> = Vec::new();
    for node in nodes {
        chain.push(match node {
            PlanNode::Project { exprs, schema } => {
                Box::new(Project::new(exprs, schema, errors.clone()))
            }
            PlanNode::Filter { predicate } => Box::new(Filter::new(predicate, errors.clone())),
            PlanNode::Aggregate {
                group_exprs,
                group_types,
                calls,
                schema,
            } => {
                let groups = tables.next().expect("allocated");
                let extremes = tables.next().expect("allocated");
                Box::new(HashAgg::new(
                    ctx.store.clone(),
                    groups,
                    extremes,
                    group_exprs,
                    group_types,
                    calls,
                    schema,
                    errors.clone(),
                )?)
            }
        });
    }
    Ok(Actor {
        id,
        inputs: AlignedInputs::new(vec![input]),
        chain,
        materialize: Materialize::new(ctx.store.clone(), state_tables[0], schema)?,
        state_tables: state_tables.to_vec(),
        store: ctx.store.clone(),
        events: ctx.events.clone(),
        chunk_rows_max: ctx.chunk_rows_max,
        outputs: Vec::new(),
    })
}
