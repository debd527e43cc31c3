//! `StreamPlan`: what `sql/` compiles a view's query into, and how it becomes an actor.
//!
//! A plan is a tree of operators whose leaves are the actor's inputs: each input is the change
//! stream of one relation (a table or view); a relation read twice (a self-join) is two
//! inputs. Unary operators (project, filter, aggregate) have one child, a join two, a union
//! any number.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::physical_plan::PhysicalExpr;
use tokio::sync::mpsc;

mod explain;
mod rewrite;
mod share;

use super::actor::{Actor, ActorErrors, OpNode};
use super::align::AlignedInputs;
use super::coordinator::ActorEvent;
use super::expr::{ErrorSink, ERRORS_TABLE};
use super::message::{ActorId, Message};
use super::operators::expand::Expand;
use super::operators::filter::Filter;
use super::operators::hash_agg::HashAgg;
use super::operators::join::HashJoin;
use super::operators::materialize::Materialize;
use super::operators::project::Project;
use super::operators::temporal_filter::TemporalFilter;
use super::operators::top_n::TopN;
use super::operators::union::Union;
use super::operators::upsert::Upsert;
use super::spec::{AggSpec, JoinSpec, TemporalSpec, TopNSpec, UpsertSpec};
use crate::error::{Error, Result};
use crate::state::{StateStore, StateTable, TableId};

#[derive(Clone)]
pub struct StreamPlan {
    /// The relations (table or view ids) feeding the plan; leaf `Input(i)` reads `inputs[i]`.
    pub inputs: Vec<ActorId>,
    pub root: PlanNode,
    /// The schema of the view's rows.
    pub schema: SchemaRef,
    /// Columns that identify a row among the view's rows, where the planner can tell (the
    /// groups of an aggregate, a table's primary key through projections and filters).
    pub key: Option<Vec<usize>>,
    /// The view only ever inserts rows: it never updates or deletes one.
    pub append_only: bool,
}

#[derive(Clone)]
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
        spec: AggSpec,
    },
    Join {
        left: Box<PlanNode>,
        right: Box<PlanNode>,
        spec: JoinSpec,
    },
    /// Each row of `input` through every one of `projections` (a `UNION ALL` of projections of
    /// the same rows, read once).
    Expand {
        input: Box<PlanNode>,
        projections: Vec<Vec<Arc<dyn PhysicalExpr>>>,
        input_schema: SchemaRef,
        schema: SchemaRef,
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
    /// A connector table's changes by key turned into changes of its rows (a table's actor
    /// only, never a view's).
    Upsert {
        input: Box<PlanNode>,
        spec: UpsertSpec,
    },
    /// A subplan that more than one parent reads (the same operators over the same relations,
    /// `share::share_subplans`): every occurrence carries the same subtree and `id`, and the
    /// cut computes it once, in a fragment of its own that sends its output to each reader.
    /// Only between that rewrite and the cut: a fragment never holds one.
    Shared {
        id: usize,
        input: Box<PlanNode>,
    },
}

impl PlanNode {
    /// How many state tables this subtree's operators need.
    pub fn state_tables_needed(&self) -> usize {
        match self {
            PlanNode::Input(_) => 0,
            PlanNode::Project { input, .. }
            | PlanNode::Filter { input, .. }
            | PlanNode::Expand { input, .. }
            | PlanNode::Upsert { input, .. }
            | PlanNode::Shared { input, .. } => input.state_tables_needed(),
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

impl StreamPlan {
    /// How many state tables the plan's operators need besides the view's own Materialize.
    pub fn state_tables_needed(&self) -> usize {
        self.root.state_tables_needed()
    }

    /// Cuts the plan into fragments of `parallelism` actors each (see
    /// `docs/design/0002-parallel-dataflow.md`). Fragment 0 is the view's own actor, which
    /// keeps the view's rows; with parallelism 1, or no operator keyed by its rows' values, it
    /// is the only fragment but for subplans the query computes more than once
    /// (`share::share_subplans`), each computed once in a fragment of its own. The cut is
    /// deterministic: a restart cuts a view's plan the same way, and finds each actor's state
    /// tables where they were.
    pub fn fragments(self, parallelism: usize) -> Result<Vec<Fragment>> {
        self.cut(parallelism, true)
    }

    /// Like `fragments`, as a view was cut before reads were shared and window aggregates
    /// sliced (plan format 2): for a view of a catalog that kept no plan (catalog format 2
    /// and earlier), whose state was written by a plan cut that way.
    pub fn fragments_unshared(self, parallelism: usize) -> Result<Vec<Fragment>> {
        self.cut(parallelism, false)
    }

    fn cut(self, parallelism: usize, share_reads: bool) -> Result<Vec<Fragment>> {
        let mut cut = Fragmenter {
            parallelism,
            fragments: Vec::new(),
            shared: HashMap::new(),
        };
        let root = match share_reads {
            true => rewrite::share_reads(self.root, &self.inputs)?,
            false => self.root,
        };
        let root = if parallelism > 1 {
            rewrite::two_step(root)?
        } else {
            root
        };
        let root = match share_reads {
            true => share::share_subplans(root, &self.inputs)?,
            false => root,
        };
        cut.single_fragment(root)?;
        cut.fragments
            .into_iter()
            .map(|f| f.ok_or_else(|| Error::internal("a fragment left unbuilt")))
            .collect()
    }
}

/// Key expressions that decide which of a fragment's actors a row goes to.
#[derive(Clone)]
pub struct Keys {
    pub exprs: Vec<Arc<dyn PhysicalExpr>>,
    /// The types the keys are hashed in.
    pub types: Vec<DataType>,
}

impl Keys {
    /// The same keys over the input of a projection that computes `exprs`.
    fn through(&self, exprs: &[Arc<dyn PhysicalExpr>]) -> Result<Keys> {
        Ok(Keys {
            exprs: self
                .exprs
                .iter()
                .map(|key| rewrite::below_projection(key, exprs))
                .collect::<Result<_>>()?,
            types: self.types.clone(),
        })
    }
}

/// Where one input channel of a fragment's actors comes from.
#[derive(Clone)]
pub enum Source {
    /// The rows of relation `StreamPlan::inputs[input]`, split among the fragment's actors by
    /// `keys` over the relation's columns (`None`: the fragment's one actor gets them all).
    Relation { input: usize, keys: Option<Keys> },
    /// The output of actor `actor` of fragment `fragment`, split among the reading fragment's
    /// actors by `keys` over that output (`None`: the fragment's one actor gets it all). A
    /// fragment read by several (a shared subplan) sends each reader its own copy.
    Fragment {
        fragment: usize,
        actor: usize,
        keys: Option<Keys>,
    },
}

/// Part of a view's plan, run as `actors` actors that each own a share of the virtual nodes
/// of the keys its operators are keyed by.
pub struct Fragment {
    /// Leaf `Input(i)` reads `sources[i]`.
    pub root: PlanNode,
    pub sources: Vec<Source>,
    pub actors: usize,
}

/// The keys an operator partitions its input `k`'s rows by, if it is keyed by their values:
/// a grouped aggregate, an equi-join, a Top-N per partition.
fn input_keys(node: &PlanNode) -> Option<Vec<Keys>> {
    let keys = |exprs: &[Arc<dyn PhysicalExpr>], types: &[DataType]| Keys {
        exprs: exprs.to_vec(),
        types: types.to_vec(),
    };
    // Every kind of node is named: a new keyed operator missing here would run unparallelised.
    match node {
        PlanNode::Aggregate { spec, .. } => {
            (!spec.group_exprs.is_empty()).then(|| vec![keys(&spec.group_exprs, &spec.group_types)])
        }
        PlanNode::Join { spec, .. } => (!spec.left_keys.is_empty()).then(|| {
            vec![
                keys(&spec.left_keys, &spec.key_types),
                keys(&spec.right_keys, &spec.key_types),
            ]
        }),
        PlanNode::TopN { spec, .. } => {
            (!spec.partition.is_empty()).then(|| vec![keys(&spec.partition, &spec.partition_types)])
        }
        PlanNode::Input(_)
        | PlanNode::Project { .. }
        | PlanNode::Filter { .. }
        | PlanNode::Expand { .. }
        | PlanNode::Union { .. }
        | PlanNode::TemporalFilter { .. }
        | PlanNode::Upsert { .. }
        | PlanNode::Shared { .. } => None,
    }
}

/// Whether `node` is a chain of row-by-row operators over a keyed operator: it can run in a
/// parallel fragment partitioned by that operator's keys.
fn leads_to_keyed(node: &PlanNode) -> bool {
    // Every kind of node is named: a new row-by-row operator missing here would end the chain.
    match node {
        PlanNode::Project { input, .. }
        | PlanNode::Filter { input, .. }
        | PlanNode::Expand { input, .. }
        | PlanNode::TemporalFilter { input, .. } => leads_to_keyed(input),
        PlanNode::Aggregate { .. } | PlanNode::Join { .. } | PlanNode::TopN { .. } => {
            input_keys(node).is_some()
        }
        // A shared subplan is a fragment of its own, read through an exchange.
        PlanNode::Input(_)
        | PlanNode::Union { .. }
        | PlanNode::Upsert { .. }
        | PlanNode::Shared { .. } => false,
    }
}

struct Fragmenter {
    parallelism: usize,
    /// Reserved when a fragment is started, filled when it is built.
    fragments: Vec<Option<Fragment>>,
    /// The fragment computing each shared subplan (`PlanNode::Shared`'s id), once built.
    shared: HashMap<usize, usize>,
}

impl Fragmenter {
    fn reserve(&mut self) -> usize {
        self.fragments.push(None);
        self.fragments.len() - 1
    }

    /// A one-actor fragment computing `node`.
    fn single_fragment(&mut self, node: PlanNode) -> Result<usize> {
        let id = self.reserve();
        let mut sources = Vec::new();
        let root = self.single(node, &mut sources)?;
        self.fragments[id] = Some(Fragment {
            root,
            sources,
            actors: 1,
        });
        Ok(id)
    }

    /// A parallel fragment computing `node`, a chain over a keyed operator.
    fn keyed_fragment(&mut self, node: PlanNode) -> Result<usize> {
        let id = self.reserve();
        let mut sources = Vec::new();
        let root = self.keyed(node, None, &mut sources)?;
        self.fragments[id] = Some(Fragment {
            root,
            sources,
            actors: self.parallelism,
        });
        Ok(id)
    }

    /// The fragment computing shared subplan `id`, whose subtree is `node`: built at its first
    /// occurrence; every later one is the same subtree, left unbuilt.
    fn shared_fragment(&mut self, id: usize, node: PlanNode) -> Result<usize> {
        if let Some(&fragment) = self.shared.get(&id) {
            return Ok(fragment);
        }
        let fragment = if self.parallelism > 1 && leads_to_keyed(&node) {
            self.keyed_fragment(node)?
        } else {
            self.single_fragment(node)?
        };
        self.shared.insert(id, fragment);
        Ok(fragment)
    }

    /// `node` inside a one-actor fragment; a keyed part below runs as a parallel fragment
    /// whose output this one gathers.
    fn single(&mut self, node: PlanNode, sources: &mut Vec<Source>) -> Result<PlanNode> {
        if let PlanNode::Shared { id, input } = node {
            let below = self.shared_fragment(id, *input)?;
            return self.read(below, None, sources);
        }
        if self.parallelism > 1 && leads_to_keyed(&node) {
            let below = self.keyed_fragment(node)?;
            return self.read(below, None, sources);
        }
        if let PlanNode::Input(input) = node {
            sources.push(Source::Relation { input, keys: None });
            return Ok(PlanNode::Input(sources.len() - 1));
        }
        node.try_map_children(&mut |child| self.single(child, sources), &mut |_| {
            Err(Error::internal("a leaf among an operator's children"))
        })
    }

    /// `node` inside a parallel fragment, whose rows are partitioned by `key` (over `node`'s
    /// output) once an operator above has chosen it.
    fn keyed(
        &mut self,
        node: PlanNode,
        key: Option<Keys>,
        sources: &mut Vec<Source>,
    ) -> Result<PlanNode> {
        if let PlanNode::Shared { id, input } = node {
            // A chain over a keyed operator never ends in a shared subplan (`leads_to_keyed`):
            // only an operator's keyed input reaches one.
            let Some(key) = key else {
                return Err(Error::internal(
                    "a shared subplan read unsplit by parallel actors",
                ));
            };
            let below = self.shared_fragment(id, *input)?;
            return self.read(below, Some(key), sources);
        }
        let Some(key) = key else {
            // The fragment's keyed operator, or the row-by-row chain above it.
            return match input_keys(&node) {
                Some(keys) => {
                    let mut keys = keys.into_iter();
                    node.try_map_children(
                        &mut |child| self.keyed(child, keys.next(), sources),
                        &mut |_| Err(Error::internal("an operator's input read directly")),
                    )
                }
                None => node
                    .try_map_children(&mut |child| self.keyed(child, None, sources), &mut |_| {
                        Err(Error::internal("a parallel fragment without keys"))
                    }),
            };
        };
        match node {
            PlanNode::Input(input) => {
                sources.push(Source::Relation {
                    input,
                    keys: Some(key),
                });
                Ok(PlanNode::Input(sources.len() - 1))
            }
            PlanNode::Project {
                input,
                exprs,
                input_schema,
                schema,
            } => {
                let below = key.through(&exprs)?;
                Ok(PlanNode::Project {
                    input: Box::new(self.keyed(*input, Some(below), sources)?),
                    exprs,
                    input_schema,
                    schema,
                })
            }
            PlanNode::Expand {
                input,
                projections,
                input_schema,
                schema,
            } => {
                let below = projections
                    .iter()
                    .map(|p| key.through(p))
                    .collect::<Result<Vec<_>>>()?;
                if below.iter().all(|k| k.exprs == below[0].exprs) {
                    // Every copy of a row goes where the row goes.
                    let below = below.into_iter().next();
                    return Ok(PlanNode::Expand {
                        input: Box::new(self.keyed(*input, below, sources)?),
                        projections,
                        input_schema,
                        schema,
                    });
                }
                let node = PlanNode::Expand {
                    input,
                    projections,
                    input_schema,
                    schema,
                };
                if leads_to_keyed(&node) {
                    // The copies of a keyed operator's results, split by the key after.
                    let below = self.keyed_fragment(node)?;
                    self.read(below, Some(key), sources)
                } else {
                    // Copies of a relation's rows: each copy read apart, split by its key.
                    self.keyed(node.into_union(), Some(key), sources)
                }
            }
            node @ (PlanNode::Filter { .. }
            | PlanNode::TemporalFilter { .. }
            | PlanNode::Union { .. }
            | PlanNode::Upsert { .. }) => node.try_map_children(
                &mut |child| self.keyed(child, Some(key.clone()), sources),
                &mut |_| Err(Error::internal("a leaf among an operator's children")),
            ),
            // Another stateful operator: its own fragment, whose output is split by this key.
            node => {
                let below = if input_keys(&node).is_some() {
                    self.keyed_fragment(node)?
                } else {
                    self.single_fragment(node)?
                };
                self.read(below, Some(key), sources)
            }
        }
    }

    /// The leaf that reads every actor of fragment `fragment`, its output split by `keys`.
    fn read(
        &mut self,
        fragment: usize,
        keys: Option<Keys>,
        sources: &mut Vec<Source>,
    ) -> Result<PlanNode> {
        let f = self.fragments[fragment]
            .as_ref()
            .ok_or_else(|| Error::internal("reading an unbuilt fragment"))?;
        let first = sources.len();
        sources.extend((0..f.actors).map(|actor| Source::Fragment {
            fragment,
            actor,
            keys: keys.clone(),
        }));
        if f.actors == 1 {
            return Ok(PlanNode::Input(first));
        }
        let schema = f
            .root
            .schema()
            .ok_or_else(|| Error::internal("a fragment without a known schema"))?;
        Ok(PlanNode::Union {
            inputs: (first..first + f.actors).map(PlanNode::Input).collect(),
            schema,
        })
    }
}

impl PlanNode {
    /// The schema of the node's output, where the node records it (not for a bare input).
    pub(super) fn schema(&self) -> Option<SchemaRef> {
        match self {
            PlanNode::Input(_) => None,
            PlanNode::Filter { input, .. } | PlanNode::Shared { input, .. } => input.schema(),
            PlanNode::Project { schema, .. }
            | PlanNode::Expand { schema, .. }
            | PlanNode::Union { schema, .. } => Some(schema.clone()),
            PlanNode::Aggregate { spec, .. } => Some(spec.schema.clone()),
            PlanNode::Join { spec, .. } => Some(spec.schema.clone()),
            PlanNode::TopN { spec, .. } => Some(spec.schema.clone()),
            PlanNode::TemporalFilter { spec, .. } => Some(spec.schema.clone()),
            PlanNode::Upsert { spec, .. } => Some(spec.schema.clone()),
        }
    }

    /// The node's inputs, in order.
    pub(super) fn children(&self) -> Vec<&PlanNode> {
        match self {
            PlanNode::Input(_) => vec![],
            PlanNode::Project { input, .. }
            | PlanNode::Filter { input, .. }
            | PlanNode::Aggregate { input, .. }
            | PlanNode::TopN { input, .. }
            | PlanNode::Expand { input, .. }
            | PlanNode::TemporalFilter { input, .. }
            | PlanNode::Upsert { input, .. }
            | PlanNode::Shared { input, .. } => vec![input],
            PlanNode::Join { left, right, .. } => vec![left, right],
            PlanNode::Union { inputs, .. } => inputs.iter().collect(),
        }
    }

    /// An `Expand` as the union of its projections, each over its own copy of the input (a
    /// chain of stateless operators); any other node as it is.
    fn into_union(self) -> PlanNode {
        match self {
            PlanNode::Expand {
                input,
                projections,
                input_schema,
                schema,
            } => PlanNode::Union {
                inputs: projections
                    .into_iter()
                    .map(|exprs| PlanNode::Project {
                        input: input.clone(),
                        exprs,
                        input_schema: input_schema.clone(),
                        schema: schema.clone(),
                    })
                    .collect(),
                schema,
            },
            other => other,
        }
    }

    /// The node with each child replaced by `child(child)`, and a leaf by `leaf(input)`.
    fn try_map_children(
        self,
        child: &mut dyn FnMut(PlanNode) -> Result<PlanNode>,
        leaf: &mut dyn FnMut(usize) -> Result<PlanNode>,
    ) -> Result<PlanNode> {
        let mut boxed = |b: Box<PlanNode>| -> Result<Box<PlanNode>> { Ok(Box::new(child(*b)?)) };
        Ok(match self {
            PlanNode::Input(i) => leaf(i)?,
            PlanNode::Project {
                input,
                exprs,
                input_schema,
                schema,
            } => PlanNode::Project {
                input: boxed(input)?,
                exprs,
                input_schema,
                schema,
            },
            PlanNode::Filter { input, predicate } => PlanNode::Filter {
                input: boxed(input)?,
                predicate,
            },
            PlanNode::Aggregate { input, spec } => PlanNode::Aggregate {
                input: boxed(input)?,
                spec,
            },
            PlanNode::Join { left, right, spec } => PlanNode::Join {
                left: boxed(left)?,
                right: boxed(right)?,
                spec,
            },
            PlanNode::Union { inputs, schema } => PlanNode::Union {
                inputs: inputs.into_iter().map(&mut *child).collect::<Result<_>>()?,
                schema,
            },
            PlanNode::Expand {
                input,
                projections,
                input_schema,
                schema,
            } => PlanNode::Expand {
                input: boxed(input)?,
                projections,
                input_schema,
                schema,
            },
            PlanNode::TopN { input, spec } => PlanNode::TopN {
                input: boxed(input)?,
                spec,
            },
            PlanNode::TemporalFilter { input, spec } => PlanNode::TemporalFilter {
                input: boxed(input)?,
                spec,
            },
            PlanNode::Upsert { input, spec } => PlanNode::Upsert {
                input: boxed(input)?,
                spec,
            },
            PlanNode::Shared { id, input } => PlanNode::Shared {
                id,
                input: boxed(input)?,
            },
        })
    }
}

/// Everything an actor needs from the server to run.
pub struct ActorContext {
    pub store: Arc<StateStore>,
    pub events: mpsc::Sender<ActorEvent>,
    pub chunk_rows_max: usize,
    /// About how many bytes of its rows a relation sends a new view per barrier.
    pub backfill_bytes_per_barrier: usize,
    /// Where actors run (`actor::Dataflow`).
    pub runtime: tokio::runtime::Handle,
}

/// Builds the actor of a relation: the operators of `root` (just `Input(0)` for a table) in
/// front of the relation's Materialize, which stores rows of `schema` with their columns in
/// `order` (empty: their own). `state_tables[0]` is the Materialize's table; the operators
/// take the rest in pre-order. A parallel worker (`schema` `None`) has no Materialize, and
/// its operators take every table.
pub fn build_actor(
    ctx: &ActorContext,
    id: ActorId,
    root: PlanNode,
    schema: Option<(SchemaRef, Vec<usize>)>,
    state_tables: &[TableId],
    inputs: Vec<mpsc::Receiver<Message>>,
    errors: ErrorSink,
) -> Result<Actor> {
    let operators_from = if schema.is_some() { 1 } else { 0 };
    let mut tables = state_tables[operators_from..].iter().copied();
    // The actor's share of its view's errors starts where its state left it (restored).
    let errors_table = StateTable::new(ctx.store.clone(), ERRORS_TABLE);
    let kept = ActorErrors::read(&errors_table, id)?;
    let errors = errors.for_actor(kept);
    let root = build_node(ctx, root, &mut tables, &errors)?;
    let materialize = match schema {
        Some((schema, order)) => Some(Materialize::new(
            ctx.store.clone(),
            state_tables[0],
            schema,
            &order,
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
        backfill_bytes_per_barrier: ctx.backfill_bytes_per_barrier,
        backfilling: Vec::new(),
        outputs: Vec::new(),
        watermarks: Vec::new(),
        sink: None,
        source: None,
        errors: ActorErrors {
            sink: errors,
            table: errors_table,
            kept,
        },
        runtime: ctx.runtime.clone(),
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
        PlanNode::Aggregate { input, spec } => {
            let own = [next_table(tables), next_table(tables)];
            let agg = HashAgg::new(ctx.store.clone(), own, spec, errors.clone())?;
            OpNode::unary(Box::new(agg), build_node(ctx, *input, tables, errors)?)
        }
        PlanNode::Join { left, right, spec } => {
            let sides = [next_table(tables), next_table(tables)];
            let join = HashJoin::new(
                ctx.store.clone(),
                sides,
                spec,
                errors.clone(),
                ctx.chunk_rows_max,
            )?;
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
        PlanNode::Upsert { input, spec } => {
            let upsert = Upsert::new(ctx.store.clone(), spec)?;
            OpNode::unary(Box::new(upsert), build_node(ctx, *input, tables, errors)?)
        }
        PlanNode::Expand {
            input,
            projections,
            input_schema,
            schema,
        } => {
            let projections = projections
                .into_iter()
                .map(|exprs| {
                    Project::new(exprs, input_schema.clone(), schema.clone(), errors.clone())
                })
                .collect();
            OpNode::unary(
                Box::new(Expand::new(projections)),
                build_node(ctx, *input, tables, errors)?,
            )
        }
        PlanNode::Union { inputs, schema } => OpNode::Op {
            op: Box::new(Union::new(schema, inputs.len())),
            inputs: inputs
                .into_iter()
                .map(|i| build_node(ctx, i, tables, errors))
                .collect::<Result<_>>()?,
        },
        PlanNode::Shared { .. } => {
            return Err(Error::internal("a shared subplan left in a fragment"))
        }
    })
}

fn next_table(tables: &mut impl Iterator<Item = TableId>) -> TableId {
    tables
        .next()
        .expect("state tables allocated for every operator")
}
