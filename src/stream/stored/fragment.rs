//! One fragment of a view's plan as the catalog keeps it: its operators as a flat list,
//! children first, and its sources; and the same encoding of a subtree as a fingerprint.

use super::*;

pub(super) fn encode_fragment(f: &Fragment, input_schemas: &[SchemaRef]) -> Result<StoredFragment> {
    let keys = |k: &Keys| -> Result<StoredKeys> {
        Ok(StoredKeys {
            exprs: exprs(&k.exprs)?,
            types: types(&k.types)?,
        })
    };
    let nodes = encode_nodes(&f.root)?;
    Ok(StoredFragment {
        input_schemas: input_schemas
            .iter()
            .map(|s| StoredSchema::of(s))
            .collect::<Result<_>>()?,
        nodes,
        sources: f
            .sources
            .iter()
            .map(|s| {
                Ok(match s {
                    Source::Relation { input, keys: k } => StoredSource::Relation {
                        input: *input,
                        keys: k.as_ref().map(keys).transpose()?,
                    },
                    Source::Fragment {
                        fragment,
                        actor,
                        keys: k,
                    } => StoredSource::Fragment {
                        fragment: *fragment,
                        actor: *actor,
                        keys: k.as_ref().map(keys).transpose()?,
                    },
                })
            })
            .collect::<Result<_>>()?,
        actors: f.actors,
        output: None,
    })
}

/// The operators of the tree under `root`, children first (`StoredFragment::nodes`).
fn encode_nodes(root: &PlanNode) -> Result<Vec<StoredNode>> {
    // Without recursion: a node is written once all its children are, and `done` holds the
    // indices of the subtrees written and not yet claimed.
    let mut nodes = Vec::new();
    let mut done: Vec<usize> = Vec::new();
    let mut stack: Vec<(&PlanNode, bool)> = vec![(root, false)];
    while let Some((n, expanded)) = stack.pop() {
        let below = n.children();
        if !expanded {
            stack.push((n, true));
            stack.extend(below.into_iter().rev().map(|c| (c, false)));
            continue;
        }
        let kids = done.split_off(done.len() - below.len());
        nodes.push(encode_node(n, &kids)?);
        done.push(nodes.len() - 1);
    }
    Ok(nodes)
}

/// A text that two subtrees of a view's plan share exactly when they compute the same rows:
/// their operators as the catalog keeps them, each leaf named by the relation it reads
/// (`relations`, the plan's inputs). `None` for a subtree the catalog could not keep.
pub fn fingerprint(node: &PlanNode, relations: &[ActorId]) -> Option<String> {
    let mut nodes = encode_nodes(node).ok()?;
    for n in &mut nodes {
        if let StoredNode::Input(i) = n {
            *i = *relations.get(*i)? as usize;
        }
    }
    serde_json::to_string(&nodes).ok()
}

/// Fragment `f` of the fragments `all` of a plan.
pub(super) fn decode_fragment(
    f: &StoredFragment,
    all: &[StoredFragment],
    functions: &dyn Functions,
) -> Result<Fragment> {
    let inputs: Vec<SchemaRef> = f
        .input_schemas
        .iter()
        .map(StoredSchema::arrow)
        .collect::<Result<_>>()?;
    let decode_keys = |k: &StoredKeys, schema: &Schema| -> Result<Keys> {
        Ok(Keys {
            exprs: decode_exprs(&k.exprs, schema, functions)?,
            types: decode_types(&k.types)?,
        })
    };
    // Each node's operator and the schema of its rows, until its parent takes it.
    let mut built: Vec<Option<(PlanNode, SchemaRef)>> = Vec::with_capacity(f.nodes.len());
    for n in &f.nodes {
        let node = decode_node(n, &mut built, &inputs, functions)?;
        built.push(Some(node));
    }
    let root = built
        .pop()
        .flatten()
        .ok_or_else(|| corrupt("a fragment without operators"))?;
    if built.iter().any(Option::is_some) {
        return Err(corrupt("a fragment's operator outside its tree"));
    }
    let sources = f
        .sources
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let schema = inputs
                .get(i)
                .ok_or_else(|| corrupt("a source of no schema"))?;
            Ok(match s {
                StoredSource::Relation { input, keys } => Source::Relation {
                    input: *input,
                    keys: keys.as_ref().map(|k| decode_keys(k, schema)).transpose()?,
                },
                StoredSource::Fragment {
                    fragment,
                    actor,
                    keys,
                } => {
                    // Before format 3 the fragment read says how its output is split.
                    let read = all.get(*fragment).ok_or_else(|| {
                        corrupt("a fragment reads a fragment the plan does not have")
                    })?;
                    let keys = keys.as_ref().or(read.output.as_ref());
                    Source::Fragment {
                        fragment: *fragment,
                        actor: *actor,
                        keys: keys.map(|k| decode_keys(k, schema)).transpose()?,
                    }
                }
            })
        })
        .collect::<Result<_>>()?;
    Ok(Fragment {
        root: root.0,
        sources,
        actors: f.actors,
    })
}
