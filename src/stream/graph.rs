//! A view's actor graph: the fragments of its plan turned into actors joined by bounded
//! channels, and the barrier mutation that connects the relations it reads to them. Built
//! here, started by the caller: the actors are spawned, then the mutation travels on the
//! barrier that starts them.

use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use tokio::sync::mpsc;

use super::actor::Actor;
use super::dispatch::Partitioner;
use super::expr::ErrorSink;
use super::message::{ActorId, Backfills, Message, Mutation, NewOutput, Target};
use super::plan::{build_actor, ActorContext, Fragment, Keys, Source};
use super::sink::SinkDriver;
use crate::error::{Error, Result};
use crate::state::TableId;

/// Who a view's actors are: the ids and state tables its catalog entry gave them.
pub struct Identity<'a> {
    /// The view's name, for errors.
    pub name: &'a str,
    /// The view's id: its own actor's (fragment 0's) and the table of its rows, or of a
    /// sink's log.
    pub id: ActorId,
    /// The actors of the fragments after the first, in order.
    pub workers: &'a [ActorId],
    /// Every actor's state tables in order, each taking as many as its fragment needs.
    pub state_tables: &'a [TableId],
    /// A sink keeps no rows: its own actor hands its changes to this.
    pub sink: Option<SinkDriver>,
}

/// What the view's actors read and write.
pub struct Wiring<'a> {
    /// The relations the plan reads (`StreamPlan::inputs`).
    pub relations: &'a [ActorId],
    /// The schema of the view's rows.
    pub schema: SchemaRef,
    /// Whether the relations send their contents first (a new view) or only their changes
    /// (a view restored with its state).
    pub backfill: bool,
    /// Capacity of each channel, in messages.
    pub channel_messages_max: usize,
    pub errors: ErrorSink,
}

/// A view's actors, built and not started, and how they join the dataflow.
pub struct Graph {
    pub actors: Vec<Actor>,
    /// Gives the relations read their outputs to the graph's actors, at the barrier that
    /// starts them.
    pub mutation: Mutation,
    /// The parts of the relations' contents still to come (none without backfill).
    pub backfills: Arc<Backfills>,
}

impl Graph {
    pub fn ids(&self) -> Vec<ActorId> {
        self.actors.iter().map(|a| a.id).collect()
    }
}

/// The actors of `fragments` (fragment 0 the view's own), joined by channels: a relation feeds
/// each of its sources in a fragment through one output, split among the fragment's actors;
/// each actor of a producing fragment has one output to each fragment that reads it, split
/// by that reader's keys.
pub fn wire(
    ctx: &ActorContext,
    mut view: Identity,
    fragments: Vec<Fragment>,
    wiring: Wiring,
) -> Result<Graph> {
    let mismatch = || {
        Error::internal(format!(
            "view \"{}\": its catalog entry does not fit its plan",
            view.name
        ))
    };
    let actors = identities(&view, &fragments, mismatch)?;
    let mut mutation = Mutation::default();
    let relation_sources = fragments
        .iter()
        .flat_map(|f| &f.sources)
        .filter(|s| matches!(s, Source::Relation { .. }))
        .count();
    let backfills = Arc::new(Backfills::new(if wiring.backfill {
        relation_sources
    } else {
        0
    }));
    let mut receivers: Vec<Vec<Vec<mpsc::Receiver<Message>>>> = Vec::new();
    // Each producing actor's outputs: one per source that reads it.
    let mut outputs: Vec<Vec<Vec<NewOutput>>> = fragments
        .iter()
        .map(|f| (0..f.actors).map(|_| Vec::new()).collect())
        .collect();
    for (f, fragment) in fragments.iter().enumerate() {
        let mut per_actor: Vec<Vec<mpsc::Receiver<Message>>> =
            (0..fragment.actors).map(|_| Vec::new()).collect();
        for source in &fragment.sources {
            let mut targets: Vec<Target> = Vec::new();
            for (a, (id, _)) in actors[f].iter().enumerate() {
                let (tx, rx) = mpsc::channel(wiring.channel_messages_max);
                per_actor[a].push(rx);
                targets.push((*id, tx));
            }
            match source {
                Source::Relation { input, keys } => {
                    let relation = *wiring.relations.get(*input).ok_or_else(mismatch)?;
                    mutation
                        .add_outputs
                        .entry(relation)
                        .or_default()
                        .push(NewOutput {
                            targets,
                            partitioner: partitioner(keys.as_ref(), fragment.actors),
                            backfill: wiring.backfill.then(|| backfills.clone()),
                        });
                }
                Source::Fragment {
                    fragment: producer,
                    actor,
                    keys,
                } => outputs
                    .get_mut(*producer)
                    .and_then(|o| o.get_mut(*actor))
                    .ok_or_else(mismatch)?
                    .push(NewOutput {
                        targets,
                        partitioner: partitioner(keys.as_ref(), fragment.actors),
                        backfill: None,
                    }),
            }
        }
        receivers.push(per_actor);
    }
    let mut built = Vec::new();
    for (f, fragment) in fragments.into_iter().enumerate() {
        let schema = (f == 0 && view.sink.is_none()).then(|| (wiring.schema.clone(), Vec::new()));
        for (a, ((id, tables), inputs)) in actors[f]
            .iter()
            .zip(std::mem::take(&mut receivers[f]))
            .enumerate()
        {
            let mut actor = build_actor(
                ctx,
                *id,
                fragment.root.clone(),
                schema.clone(),
                tables,
                inputs,
                wiring.errors.clone(),
            )?;
            if f == 0 {
                actor.sink = view.sink.take();
                if actor.sink.is_some() {
                    // A sink's log is under its id (`SinkLog`): it goes with the sink.
                    actor.state_tables.push(view.id);
                }
            }
            actor.outputs.append(&mut outputs[f][a]);
            built.push(actor);
        }
    }
    Ok(Graph {
        actors: built,
        mutation,
        backfills,
    })
}

/// A fragment's actors, each with its state tables.
type FragmentActors = Vec<(ActorId, Vec<TableId>)>;

/// Each fragment's actors with their state tables, taken in order from the view's: fragment
/// 0's actor is the view's own, whose first table holds the view's rows.
fn identities(
    view: &Identity,
    fragments: &[Fragment],
    mismatch: impl Fn() -> Error,
) -> Result<Vec<FragmentActors>> {
    let mut ids = view.workers.iter().copied();
    let mut tables = view.state_tables.iter().copied();
    let mut actors = Vec::new();
    for (f, fragment) in fragments.iter().enumerate() {
        let needed = fragment.root.state_tables_needed();
        let mut these = Vec::new();
        for _ in 0..fragment.actors {
            let (id, mut own) = match f {
                // A sink keeps no rows of its own.
                0 if view.sink.is_some() => (view.id, Vec::new()),
                0 => (view.id, vec![view.id]),
                _ => (ids.next().ok_or_else(&mismatch)?, Vec::new()),
            };
            for _ in 0..needed {
                own.push(tables.next().ok_or_else(&mismatch)?);
            }
            these.push((id, own));
        }
        actors.push(these);
    }
    if ids.next().is_some() || tables.next().is_some() {
        return Err(mismatch());
    }
    Ok(actors)
}

/// The sending end of an exchange to `actors` actors: split by `keys`, or all to the one.
fn partitioner(keys: Option<&Keys>, actors: usize) -> Option<Arc<Partitioner>> {
    keys.map(|k| Arc::new(Partitioner::new(k.exprs.clone(), k.types.clone(), actors)))
}
