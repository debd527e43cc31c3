//! EXPLAIN of a view's plan: its operator tree, and its fragments with their actors and the
//! keys that split rows between them.

use std::sync::Arc;

use datafusion::physical_plan::PhysicalExpr;

use super::{Fragment, Keys, PlanNode, Source};

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
            PlanNode::Aggregate { spec, .. } => {
                let calls: Vec<String> = spec
                    .calls
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
                    list(&spec.group_exprs),
                    calls.join(", "),
                    if spec.close_on.is_some() {
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
            PlanNode::Expand { projections, .. } => {
                let copies: Vec<String> = projections.iter().map(|p| list(p)).collect();
                format!(
                    "Expand: {} copies of each row: [{}]",
                    projections.len(),
                    copies.join("], [")
                )
            }
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
            PlanNode::Upsert { spec, .. } => {
                let key: Vec<&str> = spec
                    .key
                    .iter()
                    .map(|c| spec.schema.field(*c).name().as_str())
                    .collect();
                format!("Upsert: key [{}]", key.join(", "))
            }
            PlanNode::Shared { id, .. } => format!("Shared: subplan {id}"),
        };
        out.push(format!("{}{line}", "  ".repeat(depth)));
        for child in self.children() {
            child.explain(depth + 1, inputs, out);
        }
    }
}

impl Keys {
    pub(super) fn explain(&self) -> String {
        let exprs: Vec<String> = self.exprs.iter().map(|e| e.to_string()).collect();
        exprs.join(", ")
    }
}

impl Fragment {
    /// The fragments' actors and operators, for EXPLAIN; `relations` names the plan's inputs.
    pub fn explain(fragments: &[Fragment], relations: &[String]) -> Vec<String> {
        let actors: usize = fragments.iter().map(|f| f.actors).sum();
        let mut lines = vec![format!(
            "Materialized view: {} fragment{}, {actors} actor{}",
            fragments.len(),
            if fragments.len() == 1 { "" } else { "s" },
            if actors == 1 { "" } else { "s" },
        )];
        for (i, f) in fragments.iter().enumerate() {
            // Each read of this fragment once (every read takes from its actor 0).
            let mut readers: Vec<String> = Vec::new();
            for (c, consumer) in fragments.iter().enumerate() {
                for s in &consumer.sources {
                    if let Source::Fragment {
                        fragment,
                        actor: 0,
                        keys,
                    } = s
                    {
                        if *fragment == i {
                            readers.push(match keys {
                                None => format!("to fragment {c}"),
                                Some(k) => format!("split by [{}] to fragment {c}", k.explain()),
                            });
                        }
                    }
                }
            }
            let role = match readers.is_empty() {
                true => "the view's own actor, which keeps its rows".to_string(),
                false => format!("output {}", readers.join(", ")),
            };
            lines.push(format!(
                "Fragment {i}: {} actor{}, {role}",
                f.actors,
                if f.actors == 1 { "" } else { "s" }
            ));
            let names: Vec<String> = f
                .sources
                .iter()
                .map(|s| match s {
                    Source::Relation { input, keys } => {
                        let name = relations.get(*input).map(String::as_str).unwrap_or("?");
                        match keys {
                            Some(keys) => format!("{name}, split by [{}]", keys.explain()),
                            None => name.to_string(),
                        }
                    }
                    Source::Fragment {
                        fragment, actor, ..
                    } => {
                        format!("fragment {fragment}, actor {}", actor + 1)
                    }
                })
                .collect();
            f.root.explain(1, &names, &mut lines);
        }
        lines
    }
}
