//! Subplans a query computes more than once, computed once: the same stateful operators over
//! the same relations (Nexmark q5's two counts per auction and window, one joined with the
//! maximum of the other) become one `PlanNode::Shared` that the cut runs in a fragment of its
//! own, sending its output to each reader (`docs/design/0027-shared-subplans.md`).

use std::collections::HashMap;

use super::PlanNode;
use crate::error::Result;
use crate::stream::message::ActorId;
use crate::stream::stored;

/// Wraps each largest subplan that the plan computes more than once, and whose root is a
/// stateful operator, in `PlanNode::Shared`. Two subplans are the same when the catalog would
/// keep them alike, their leaves reading the same relations (`stored::fingerprint`). A
/// stateless chain (a filter, a projection) is computed again by each reader rather than sent
/// through an exchange. `inputs` are the relations the plan's leaves read.
pub(super) fn share_subplans(root: PlanNode, inputs: &[ActorId]) -> Result<PlanNode> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    count(&root, inputs, &mut seen);
    seen.retain(|_, n| *n > 1);
    if seen.is_empty() {
        return Ok(root);
    }
    let mut wrapping = Wrapping {
        repeated: seen,
        ids: HashMap::new(),
        uses: Vec::new(),
    };
    let root = wrapping.wrap(root, inputs)?;
    // A subplan whose other occurrences all lie inside a larger shared one is read once.
    let uses = wrapping.uses;
    unwrap_single(root, &uses)
}

/// Whether the operator keeps state: only such subplans are worth an exchange.
fn stateful(node: &PlanNode) -> bool {
    // Every kind of node is named: a new stateful operator missing here would be computed
    // twice.
    match node {
        PlanNode::Aggregate { .. }
        | PlanNode::Join { .. }
        | PlanNode::TopN { .. }
        | PlanNode::TemporalFilter { .. } => true,
        PlanNode::Input(_)
        | PlanNode::Project { .. }
        | PlanNode::Filter { .. }
        | PlanNode::Expand { .. }
        | PlanNode::Union { .. }
        | PlanNode::Upsert { .. }
        | PlanNode::Shared { .. } => false,
    }
}

/// Counts the occurrences of each stateful subplan, by fingerprint.
fn count(node: &PlanNode, inputs: &[ActorId], seen: &mut HashMap<String, usize>) {
    if stateful(node) {
        if let Some(f) = stored::fingerprint(node, inputs) {
            *seen.entry(f).or_default() += 1;
        }
    }
    for child in node.children() {
        count(child, inputs, seen);
    }
}

struct Wrapping {
    /// The fingerprints of the subplans that occur more than once.
    repeated: HashMap<String, usize>,
    /// The id given to each, in the order they are first met.
    ids: HashMap<String, usize>,
    /// How many occurrences of each id were wrapped.
    uses: Vec<usize>,
}

impl Wrapping {
    /// `node` with each repeated subplan wrapped, outermost first: nothing inside a wrapped
    /// one is wrapped again, since only its first occurrence is ever built.
    fn wrap(&mut self, node: PlanNode, inputs: &[ActorId]) -> Result<PlanNode> {
        if stateful(&node) {
            if let Some(f) = stored::fingerprint(&node, inputs) {
                if self.repeated.contains_key(&f) {
                    let next = self.ids.len();
                    let id = *self.ids.entry(f).or_insert(next);
                    if id == self.uses.len() {
                        self.uses.push(0);
                    }
                    self.uses[id] += 1;
                    return Ok(PlanNode::Shared {
                        id,
                        input: Box::new(node),
                    });
                }
            }
        }
        node.try_map_children(&mut |c| self.wrap(c, inputs), &mut |i| {
            Ok(PlanNode::Input(i))
        })
    }
}

/// `node` with every `Shared` of a single use replaced by its subplan.
fn unwrap_single(node: PlanNode, uses: &[usize]) -> Result<PlanNode> {
    let node = match node {
        PlanNode::Shared { id, input } if uses.get(id).is_some_and(|&n| n < 2) => *input,
        other => other,
    };
    node.try_map_children(&mut |c| unwrap_single(c, uses), &mut |i| {
        Ok(PlanNode::Input(i))
    })
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::datatypes::DataType;
    use datafusion::physical_expr::expressions::col;

    use super::super::{Fragment, Source, StreamPlan};
    use super::*;
    use crate::stream::chunk::test_util::schema;
    use crate::stream::spec::{AggCall, AggKind, AggSpec, JoinKind, JoinSpec};

    /// `SELECT a, count(b) AS n FROM <input i> GROUP BY a`.
    fn counts(i: usize) -> PlanNode {
        let t = schema(&[("a", DataType::Int64), ("b", DataType::Int64)]);
        PlanNode::Aggregate {
            input: Box::new(PlanNode::Input(i)),
            spec: AggSpec {
                group_exprs: vec![col("a", &t).unwrap()],
                group_types: vec![DataType::Int64],
                calls: vec![AggCall {
                    kind: AggKind::Count,
                    arg: col("b", &t).unwrap(),
                    arg_type: DataType::Int64,
                    output_type: DataType::Int64,
                    distinct: false,
                    filter: None,
                }],
                schema: schema(&[("a", DataType::Int64), ("n", DataType::Int64)]),
                close_on: None,
                append_only: false,
                early: false,
            },
        }
    }

    /// Two such counts joined on their counts, over relations `inputs`.
    fn joined(inputs: Vec<ActorId>) -> StreamPlan {
        let side = schema(&[("a", DataType::Int64), ("n", DataType::Int64)]);
        let out = schema(&[
            ("a", DataType::Int64),
            ("n", DataType::Int64),
            ("a2", DataType::Int64),
            ("n2", DataType::Int64),
        ]);
        StreamPlan {
            inputs,
            root: PlanNode::Join {
                left: Box::new(counts(0)),
                right: Box::new(counts(1)),
                spec: JoinSpec {
                    kind: JoinKind::Inner,
                    left_keys: vec![col("n", &side).unwrap()],
                    right_keys: vec![col("n", &side).unwrap()],
                    key_types: vec![DataType::Int64],
                    nulls_equal: false,
                    condition: None,
                    left_schema: side.clone(),
                    right_schema: side,
                    schema: out.clone(),
                },
            },
            schema: out,
            key: None,
            append_only: false,
        }
    }

    /// Each source of `f` that reads a fragment: which one, which actor, and its keys.
    fn reads(f: &Fragment) -> Vec<(usize, usize, Option<String>)> {
        f.sources
            .iter()
            .filter_map(|s| match s {
                Source::Fragment {
                    fragment,
                    actor,
                    keys,
                } => Some((*fragment, *actor, keys.as_ref().map(|k| k.explain()))),
                Source::Relation { .. } => None,
            })
            .collect()
    }

    #[test]
    fn an_aggregate_computed_twice_is_one_fragment_that_each_reader_reads() {
        let one = joined(vec![7, 7]).fragments(1).unwrap();
        assert_eq!(one.len(), 2);
        assert_eq!(reads(&one[0]), [(1, 0, None), (1, 0, None)]);
        assert!(matches!(one[1].root, PlanNode::Aggregate { .. }));
        assert_eq!(one[1].sources.len(), 1);

        // Over two relations, or cut as before plan format 3: computed twice, in one actor.
        assert_eq!(joined(vec![7, 8]).fragments(1).unwrap().len(), 1);
        assert_eq!(joined(vec![7, 7]).fragments_unshared(1).unwrap().len(), 1);

        // In parallel: the join's actors read the aggregate's twice, each side split by its
        // own key.
        let two = joined(vec![7, 7]).fragments(2).unwrap();
        assert_eq!(two.iter().map(|f| f.actors).collect::<Vec<_>>(), [1, 2, 2]);
        let n = Some("n@1".to_string());
        assert_eq!(
            reads(&two[1]),
            [
                (2, 0, n.clone()),
                (2, 1, n.clone()),
                (2, 0, n.clone()),
                (2, 1, n)
            ]
        );
    }
}
