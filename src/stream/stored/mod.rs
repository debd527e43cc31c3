//! A view's compiled plan as the catalog keeps it (`docs/design/0009-stored-plans.md`).
//!
//! A view's state in RocksDB is laid out by its operators: which state tables each one has,
//! how it encodes keys and values, which aggregate result types it keeps. A restart that
//! compiled the view's SQL again would read that state under whatever layout the planner of
//! the running version gives, so the catalog keeps the plan the view was created with, cut
//! into its fragments, and a restart runs exactly that. Operators and expressions are flat
//! lists (children first), so that nothing here recurses, however deep the query.
//!
//! A plan carries its format; a reader meets a newer one with a refusal, never a misread.

mod expr;
mod fragment;
mod types;

use std::sync::Arc;

use datafusion::arrow::datatypes::{Schema, SchemaRef};
use datafusion::physical_expr::PhysicalExpr;
use serde::{Deserialize, Serialize};

pub use expr::Functions;
use expr::StoredExpr;
pub use fragment::fingerprint;
use fragment::{decode_fragment, encode_fragment};
use types::{corrupt, StoredSchema, Type};

use super::message::ActorId;
use super::plan::{Fragment, Keys, PlanNode, Source};
use super::spec::{
    AggCall, AggKind, AggSpec, JoinKind, JoinSpec, OrderField, RankKind, TemporalSpec, TopNSpec,
    Visible,
};
use crate::error::{Error, Result};

/// The format this version writes; it reads every one up to it. Format 2 added `Expand` and
/// aggregates that emit early (`AggSpec::early`); format 3 fragments read by several others
/// (shared subplans), each reader splitting the output by its own keys; from format 4
/// `to_char` reads PostgreSQL's templates (before, DataFusion's: chrono's `%Y`).
pub const PLAN_FORMAT: u32 = 4;

/// A view's plan, ready to start: the relations it reads, the schema of its rows, and its
/// fragments (`StreamPlan::fragments`).
pub struct Compiled {
    pub inputs: Vec<ActorId>,
    pub schema: SchemaRef,
    pub fragments: Vec<Fragment>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct StoredPlan {
    format: u32,
    inputs: Vec<ActorId>,
    schema: StoredSchema,
    fragments: Vec<StoredFragment>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct StoredFragment {
    /// The schema of the rows of each source (leaf `Input(i)` reads `sources[i]`).
    input_schemas: Vec<StoredSchema>,
    /// The operators, children first; the last is the fragment's root.
    nodes: Vec<StoredNode>,
    sources: Vec<StoredSource>,
    actors: usize,
    /// How plans before format 3 split the output among the actors of the one fragment that
    /// reads it; a reader's own keys since (`StoredSource::Fragment::keys`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    output: Option<StoredKeys>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum StoredSource {
    Relation {
        input: usize,
        keys: Option<StoredKeys>,
    },
    Fragment {
        fragment: usize,
        actor: usize,
        /// Absent before format 3, where the fragment read says (`StoredFragment::output`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        keys: Option<StoredKeys>,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct StoredKeys {
    exprs: Vec<StoredExpr>,
    types: Vec<Type>,
}

/// One operator; `usize` children are earlier nodes of the same fragment.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum StoredNode {
    Input(usize),
    Project {
        input: usize,
        exprs: Vec<StoredExpr>,
        input_schema: StoredSchema,
        schema: StoredSchema,
    },
    Filter {
        input: usize,
        predicate: StoredExpr,
    },
    Aggregate(StoredAggregate),
    Join(StoredJoin),
    Union {
        inputs: Vec<usize>,
        schema: StoredSchema,
    },
    Expand {
        input: usize,
        projections: Vec<Vec<StoredExpr>>,
        input_schema: StoredSchema,
        schema: StoredSchema,
    },
    TopN(StoredTopN),
    TemporalFilter {
        input: usize,
        row_time: StoredExpr,
        offset_us: i64,
        visible: Visible,
        schema: StoredSchema,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct StoredAggregate {
    input: usize,
    group_exprs: Vec<StoredExpr>,
    group_types: Vec<Type>,
    calls: Vec<StoredCall>,
    schema: StoredSchema,
    close_on: Option<usize>,
    append_only: bool,
    /// Absent from plans of format 1, which have no slice steps.
    #[serde(default)]
    early: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct StoredJoin {
    left: usize,
    right: usize,
    kind: JoinKind,
    left_keys: Vec<StoredExpr>,
    right_keys: Vec<StoredExpr>,
    key_types: Vec<Type>,
    nulls_equal: bool,
    condition: Option<StoredExpr>,
    left_schema: StoredSchema,
    right_schema: StoredSchema,
    schema: StoredSchema,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct StoredTopN {
    input: usize,
    partition: Vec<StoredExpr>,
    partition_types: Vec<Type>,
    order: Vec<StoredExpr>,
    order_fields: Vec<StoredOrder>,
    offset: u64,
    limit: Option<u64>,
    rank: Option<RankKind>,
    /// Absent from plans stored before rows past the limit were deleted: they keep them.
    #[serde(default)]
    append_only: bool,
    input_schema: StoredSchema,
    schema: StoredSchema,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct StoredCall {
    kind: AggKind,
    arg: StoredExpr,
    arg_type: Type,
    output_type: Type,
    distinct: bool,
    filter: Option<StoredExpr>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct StoredOrder {
    data_type: Type,
    descending: bool,
    nulls_first: bool,
}

impl Compiled {
    /// The plan as the catalog keeps it; `relations` are the schemas of `inputs`.
    pub fn encode(&self, relations: &[SchemaRef]) -> Result<serde_json::Value> {
        let mut stored: Vec<Option<StoredFragment>> = vec![None; self.fragments.len()];
        let mut outputs: Vec<Option<SchemaRef>> = vec![None; self.fragments.len()];
        // Fragments read each other without cycles, a shared one by several: each is encoded
        // once every fragment it reads is, at most one pass per fragment.
        for _ in 0..self.fragments.len() {
            for (i, f) in self.fragments.iter().enumerate() {
                if stored[i].is_some() {
                    continue;
                }
                let input_schemas = f
                    .sources
                    .iter()
                    .map(|s| match s {
                        Source::Relation { input, .. } => relations.get(*input).cloned(),
                        Source::Fragment { fragment, .. } => {
                            outputs.get(*fragment).cloned().flatten()
                        }
                    })
                    .collect::<Option<Vec<SchemaRef>>>();
                let Some(input_schemas) = input_schemas else {
                    continue;
                };
                outputs[i] = Some(output_schema(&f.root, &input_schemas)?);
                stored[i] = Some(encode_fragment(f, &input_schemas)?);
            }
        }
        if stored.iter().any(Option::is_none) {
            return Err(Error::internal(
                "a fragment reads an input of no known schema",
            ));
        }
        let plan = StoredPlan {
            format: PLAN_FORMAT,
            inputs: self.inputs.clone(),
            schema: StoredSchema::of(&self.schema)?,
            fragments: stored.into_iter().flatten().collect(),
        };
        serde_json::to_value(plan)
            .map_err(|e| Error::internal(format!("a view's plan does not serialise: {e}")))
    }

    /// The plan the catalog keeps as `value`, of view `view`.
    pub fn decode(
        value: &serde_json::Value,
        view: &str,
        functions: &dyn Functions,
    ) -> Result<Compiled> {
        let format = value.get("format").and_then(|f| f.as_u64()).unwrap_or(0);
        if format > PLAN_FORMAT as u64 {
            return Err(Error::not_supported(format!(
                "the plan of view {view} is of format {format}, newer than this version of Weir \
                 reads (up to {PLAN_FORMAT})"
            ))
            .with_hint("Start the version of Weir that wrote it, or a newer one."));
        }
        let plan: StoredPlan =
            serde_json::from_value(value.clone()).map_err(|e| corrupt(format!("{view}: {e}")))?;
        let before_4 = BeforeFormat4(functions);
        let functions: &dyn Functions = if format < 4 { &before_4 } else { functions };
        Ok(Compiled {
            inputs: plan.inputs,
            schema: plan.schema.arrow()?,
            fragments: plan
                .fragments
                .iter()
                .map(|f| decode_fragment(f, &plan.fragments, functions))
                .collect::<Result<_>>()?,
        })
    }
}

/// The functions of a plan written before format 4: its `to_char` is DataFusion's, which
/// computed the view's rows, so that a restored view goes on as it began.
struct BeforeFormat4<'a>(&'a dyn Functions);

impl Functions for BeforeFormat4<'_> {
    fn scalar(
        &self,
        name: &str,
        return_type: &datafusion::arrow::datatypes::DataType,
    ) -> Result<Arc<datafusion::logical_expr::ScalarUDF>> {
        if name == "to_char" {
            return Ok(datafusion::functions::datetime::to_char());
        }
        self.0.scalar(name, return_type)
    }

    fn config(&self) -> Arc<datafusion::config::ConfigOptions> {
        self.0.config()
    }
}

/// The schema of `node`'s rows, where its leaves read rows of `inputs`.
fn output_schema(node: &PlanNode, inputs: &[SchemaRef]) -> Result<SchemaRef> {
    let mut n = node;
    loop {
        match n {
            PlanNode::Filter { input, .. } => n = input,
            PlanNode::Input(i) => {
                return inputs
                    .get(*i)
                    .cloned()
                    .ok_or_else(|| Error::internal("a plan reads an input it does not have"))
            }
            other => {
                return other
                    .schema()
                    .ok_or_else(|| Error::internal("an operator without its schema"))
            }
        }
    }
}

fn exprs(list: &[Arc<dyn PhysicalExpr>]) -> Result<Vec<StoredExpr>> {
    list.iter().map(StoredExpr::encode).collect()
}

fn types(list: &[datafusion::arrow::datatypes::DataType]) -> Result<Vec<Type>> {
    list.iter().map(Type::of).collect()
}

fn encode_node(n: &PlanNode, kids: &[usize]) -> Result<StoredNode> {
    let kid = |i: usize| kids[i];
    Ok(match n {
        PlanNode::Input(i) => StoredNode::Input(*i),
        PlanNode::Project {
            exprs: list,
            input_schema,
            schema,
            ..
        } => StoredNode::Project {
            input: kid(0),
            exprs: exprs(list)?,
            input_schema: StoredSchema::of(input_schema)?,
            schema: StoredSchema::of(schema)?,
        },
        PlanNode::Filter { predicate, .. } => StoredNode::Filter {
            input: kid(0),
            predicate: StoredExpr::encode(predicate)?,
        },
        PlanNode::Aggregate { spec, .. } => StoredNode::Aggregate(encode_aggregate(spec, kid(0))?),
        PlanNode::Join { spec, .. } => StoredNode::Join(StoredJoin {
            left: kid(0),
            right: kid(1),
            kind: spec.kind,
            left_keys: exprs(&spec.left_keys)?,
            right_keys: exprs(&spec.right_keys)?,
            key_types: types(&spec.key_types)?,
            nulls_equal: spec.nulls_equal,
            condition: spec
                .condition
                .as_ref()
                .map(StoredExpr::encode)
                .transpose()?,
            left_schema: StoredSchema::of(&spec.left_schema)?,
            right_schema: StoredSchema::of(&spec.right_schema)?,
            schema: StoredSchema::of(&spec.schema)?,
        }),
        PlanNode::Union { schema, .. } => StoredNode::Union {
            inputs: kids.to_vec(),
            schema: StoredSchema::of(schema)?,
        },
        PlanNode::Expand {
            projections,
            input_schema,
            schema,
            ..
        } => StoredNode::Expand {
            input: kid(0),
            projections: projections
                .iter()
                .map(|p| exprs(p))
                .collect::<Result<_>>()?,
            input_schema: StoredSchema::of(input_schema)?,
            schema: StoredSchema::of(schema)?,
        },
        PlanNode::TopN { spec, .. } => StoredNode::TopN(StoredTopN {
            input: kid(0),
            partition: exprs(&spec.partition)?,
            partition_types: types(&spec.partition_types)?,
            order: exprs(&spec.order)?,
            order_fields: spec
                .order_fields
                .iter()
                .map(|f| {
                    Ok(StoredOrder {
                        data_type: Type::of(&f.data_type)?,
                        descending: f.options.descending,
                        nulls_first: f.options.nulls_first,
                    })
                })
                .collect::<Result<_>>()?,
            offset: spec.offset,
            limit: spec.limit,
            rank: spec.rank,
            append_only: spec.append_only,
            input_schema: StoredSchema::of(&spec.input_schema)?,
            schema: StoredSchema::of(&spec.schema)?,
        }),
        PlanNode::TemporalFilter { spec, .. } => StoredNode::TemporalFilter {
            input: kid(0),
            row_time: StoredExpr::encode(&spec.row_time)?,
            offset_us: spec.offset_us,
            visible: spec.visible,
            schema: StoredSchema::of(&spec.schema)?,
        },
        PlanNode::Upsert { .. } => {
            return Err(Error::internal(
                "an upsert belongs to a connector table's actor, never to a view's plan",
            ))
        }
        PlanNode::Shared { .. } => {
            return Err(Error::internal("a shared subplan left in a fragment"))
        }
    })
}

/// An aggregate reading node `input` as stored.
fn encode_aggregate(spec: &AggSpec, input: usize) -> Result<StoredAggregate> {
    let AggSpec {
        group_exprs,
        group_types,
        calls,
        schema,
        close_on,
        append_only,
        early,
    } = spec;
    Ok(StoredAggregate {
        input,
        group_exprs: exprs(group_exprs)?,
        group_types: types(group_types)?,
        calls: calls
            .iter()
            .map(|c| {
                Ok(StoredCall {
                    kind: c.kind,
                    arg: StoredExpr::encode(&c.arg)?,
                    arg_type: Type::of(&c.arg_type)?,
                    output_type: Type::of(&c.output_type)?,
                    distinct: c.distinct,
                    filter: c.filter.as_ref().map(StoredExpr::encode).transpose()?,
                })
            })
            .collect::<Result<_>>()?,
        schema: StoredSchema::of(schema)?,
        close_on: *close_on,
        append_only: *append_only,
        early: *early,
    })
}

fn decode_exprs(
    list: &[StoredExpr],
    schema: &Schema,
    functions: &dyn Functions,
) -> Result<Vec<Arc<dyn PhysicalExpr>>> {
    list.iter().map(|e| e.decode(schema, functions)).collect()
}

fn decode_types(list: &[Type]) -> Result<Vec<datafusion::arrow::datatypes::DataType>> {
    list.iter().map(Type::arrow).collect()
}

/// Operator `i`, which its parent takes from `built`: an earlier one, taken once.
fn take(
    built: &mut [Option<(PlanNode, SchemaRef)>],
    i: usize,
) -> Result<(Box<PlanNode>, SchemaRef)> {
    built
        .get_mut(i)
        .and_then(Option::take)
        .map(|(n, s)| (Box::new(n), s))
        .ok_or_else(|| corrupt("an operator's input is not an earlier, unclaimed one"))
}

fn decode_node(
    n: &StoredNode,
    built: &mut [Option<(PlanNode, SchemaRef)>],
    inputs: &[SchemaRef],
    functions: &dyn Functions,
) -> Result<(PlanNode, SchemaRef)> {
    let one = |e: &StoredExpr, schema: &Schema| e.decode(schema, functions);
    Ok(match n {
        StoredNode::Input(i) => (
            PlanNode::Input(*i),
            inputs
                .get(*i)
                .cloned()
                .ok_or_else(|| corrupt("an input of no schema"))?,
        ),
        StoredNode::Project {
            input,
            exprs,
            input_schema,
            schema,
        } => {
            let (input, _) = take(built, *input)?;
            let input_schema = input_schema.arrow()?;
            let schema = schema.arrow()?;
            (
                PlanNode::Project {
                    input,
                    exprs: decode_exprs(exprs, &input_schema, functions)?,
                    input_schema,
                    schema: schema.clone(),
                },
                schema,
            )
        }
        StoredNode::Filter { input, predicate } => {
            let (input, schema) = take(built, *input)?;
            (
                PlanNode::Filter {
                    input,
                    predicate: one(predicate, &schema)?,
                },
                schema,
            )
        }
        StoredNode::Aggregate(node) => node.decode(built, functions)?,
        StoredNode::Join(node) => node.decode(built, functions)?,
        StoredNode::Union { inputs, schema } => {
            let children = inputs
                .iter()
                .map(|&i| take(built, i).map(|(n, _)| *n))
                .collect::<Result<_>>()?;
            let schema = schema.arrow()?;
            (
                PlanNode::Union {
                    inputs: children,
                    schema: schema.clone(),
                },
                schema,
            )
        }
        StoredNode::Expand {
            input,
            projections,
            input_schema,
            schema,
        } => {
            let (input, _) = take(built, *input)?;
            let input_schema = input_schema.arrow()?;
            let schema = schema.arrow()?;
            (
                PlanNode::Expand {
                    input,
                    projections: projections
                        .iter()
                        .map(|p| decode_exprs(p, &input_schema, functions))
                        .collect::<Result<_>>()?,
                    input_schema,
                    schema: schema.clone(),
                },
                schema,
            )
        }
        StoredNode::TopN(node) => node.decode(built, functions)?,
        StoredNode::TemporalFilter {
            input,
            row_time,
            offset_us,
            visible,
            schema,
        } => {
            let (input, below) = take(built, *input)?;
            let spec = TemporalSpec {
                row_time: one(row_time, &below)?,
                offset_us: *offset_us,
                visible: *visible,
                schema: schema.arrow()?,
            };
            let schema = spec.schema.clone();
            (PlanNode::TemporalFilter { input, spec }, schema)
        }
    })
}

impl StoredAggregate {
    fn decode(
        &self,
        built: &mut [Option<(PlanNode, SchemaRef)>],
        functions: &dyn Functions,
    ) -> Result<(PlanNode, SchemaRef)> {
        let one = |e: &StoredExpr, schema: &Schema| e.decode(schema, functions);
        let StoredAggregate {
            input,
            group_exprs,
            group_types,
            calls,
            schema,
            close_on,
            append_only,
            early,
        } = self;
        let (input, below) = take(built, *input)?;
        let schema = schema.arrow()?;
        let calls = calls
            .iter()
            .map(|c| {
                Ok(AggCall {
                    kind: c.kind,
                    arg: one(&c.arg, &below)?,
                    arg_type: c.arg_type.arrow()?,
                    output_type: c.output_type.arrow()?,
                    distinct: c.distinct,
                    filter: c.filter.as_ref().map(|f| one(f, &below)).transpose()?,
                })
            })
            .collect::<Result<_>>()?;
        Ok((
            PlanNode::Aggregate {
                input,
                spec: AggSpec {
                    group_exprs: decode_exprs(group_exprs, &below, functions)?,
                    group_types: decode_types(group_types)?,
                    calls,
                    schema: schema.clone(),
                    close_on: *close_on,
                    append_only: *append_only,
                    early: *early,
                },
            },
            schema,
        ))
    }
}

impl StoredJoin {
    fn decode(
        &self,
        built: &mut [Option<(PlanNode, SchemaRef)>],
        functions: &dyn Functions,
    ) -> Result<(PlanNode, SchemaRef)> {
        let one = |e: &StoredExpr, schema: &Schema| e.decode(schema, functions);
        let StoredJoin {
            left,
            right,
            kind,
            left_keys,
            right_keys,
            key_types,
            nulls_equal,
            condition,
            left_schema,
            right_schema,
            schema,
        } = self;
        let (left, _) = take(built, *left)?;
        let (right, _) = take(built, *right)?;
        let (left_schema, right_schema) = (left_schema.arrow()?, right_schema.arrow()?);
        let both = Schema::new(
            left_schema
                .fields()
                .iter()
                .chain(right_schema.fields().iter())
                .cloned()
                .collect::<Vec<_>>(),
        );
        let schema = schema.arrow()?;
        let spec = JoinSpec {
            kind: *kind,
            left_keys: decode_exprs(left_keys, &left_schema, functions)?,
            right_keys: decode_exprs(right_keys, &right_schema, functions)?,
            key_types: decode_types(key_types)?,
            nulls_equal: *nulls_equal,
            condition: condition.as_ref().map(|c| one(c, &both)).transpose()?,
            left_schema,
            right_schema,
            schema: schema.clone(),
        };
        Ok((PlanNode::Join { left, right, spec }, schema))
    }
}

impl StoredTopN {
    fn decode(
        &self,
        built: &mut [Option<(PlanNode, SchemaRef)>],
        functions: &dyn Functions,
    ) -> Result<(PlanNode, SchemaRef)> {
        let StoredTopN {
            input,
            partition,
            partition_types,
            order,
            order_fields,
            offset,
            limit,
            rank,
            append_only,
            input_schema,
            schema,
        } = self;
        let (input, _) = take(built, *input)?;
        let input_schema = input_schema.arrow()?;
        let schema = schema.arrow()?;
        let order_fields = order_fields
            .iter()
            .map(|f| {
                Ok(OrderField {
                    data_type: f.data_type.arrow()?,
                    options: datafusion::arrow::compute::SortOptions {
                        descending: f.descending,
                        nulls_first: f.nulls_first,
                    },
                })
            })
            .collect::<Result<_>>()?;
        let spec = TopNSpec {
            partition: decode_exprs(partition, &input_schema, functions)?,
            partition_types: decode_types(partition_types)?,
            order: decode_exprs(order, &input_schema, functions)?,
            order_fields,
            offset: *offset,
            limit: *limit,
            rank: *rank,
            append_only: *append_only,
            input_schema,
            schema: schema.clone(),
        };
        Ok((PlanNode::TopN { input, spec }, schema))
    }
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::datatypes::{DataType, Field, TimeUnit};
    use datafusion::common::config::ConfigOptions;
    use datafusion::common::ScalarValue;
    use datafusion::logical_expr::{Operator, ScalarUDF};
    use datafusion::physical_expr::expressions::{
        BinaryExpr, CaseExpr, CastExpr, Column, InListExpr, IsNullExpr, LikeExpr, Literal, NotExpr,
    };
    use datafusion::physical_expr::ScalarFunctionExpr;

    use super::*;
    use crate::error::ErrorKind;
    use crate::stream::dispatch::VnodeOf;

    struct Builtins;

    /// A plan before format 4 calls DataFusion's `to_char`, whatever the planner now has.
    #[test]
    fn a_plan_before_format_4_keeps_datafusions_to_char() {
        let utf8 = DataType::Utf8;
        assert!(Builtins.scalar("to_char", &utf8).is_err());
        let before = BeforeFormat4(&Builtins);
        let to_char = before
            .scalar("to_char", &utf8)
            .expect("DataFusion's to_char");
        assert_eq!(
            format!("{:?}", to_char.inner()),
            format!("{:?}", datafusion::functions::datetime::to_char().inner())
        );
        assert!(before.scalar("upper", &utf8).is_ok());
    }

    impl Functions for Builtins {
        fn scalar(&self, name: &str, _: &DataType) -> Result<Arc<ScalarUDF>> {
            match name {
                "upper" => Ok(datafusion::functions::string::upper()),
                _ => Err(Error::new(ErrorKind::UndefinedFunction, name.to_string())),
            }
        }

        fn config(&self) -> Arc<ConfigOptions> {
            Arc::new(ConfigOptions::default())
        }
    }

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int64, true),
            Field::new("s", DataType::Utf8, true),
            Field::new(
                "t",
                DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into())),
                true,
            ),
        ]))
    }

    fn col(name: &str, i: usize) -> Arc<dyn PhysicalExpr> {
        Arc::new(Column::new(name, i))
    }

    fn lit(v: ScalarValue) -> Arc<dyn PhysicalExpr> {
        Arc::new(Literal::new(v))
    }

    fn round_trip(e: &Arc<dyn PhysicalExpr>) -> Arc<dyn PhysicalExpr> {
        let stored = StoredExpr::encode(e).unwrap();
        let json = serde_json::to_string(&stored).unwrap();
        let read: StoredExpr = serde_json::from_str(&json).unwrap();
        read.decode(&schema(), &Builtins).unwrap()
    }

    #[test]
    fn every_kind_of_expression_reads_back_as_written() {
        let schema = schema();
        let a = col("a", 0);
        let s = col("s", 1);
        let upper = Arc::new(
            ScalarFunctionExpr::try_new(
                datafusion::functions::string::upper(),
                vec![s.clone()],
                &schema,
                Arc::new(ConfigOptions::default()),
            )
            .unwrap(),
        ) as Arc<dyn PhysicalExpr>;
        let sum = Arc::new(BinaryExpr::new(
            a.clone(),
            Operator::Plus,
            lit(ScalarValue::Int64(Some(-7))),
        )) as Arc<dyn PhysicalExpr>;
        let exprs: Vec<Arc<dyn PhysicalExpr>> = vec![
            sum.clone(),
            Arc::new(CastExpr::new(sum.clone(), DataType::Utf8, None)),
            Arc::new(NotExpr::new(Arc::new(IsNullExpr::new(a.clone())))),
            Arc::new(
                CaseExpr::try_new(
                    None,
                    vec![(
                        Arc::new(BinaryExpr::new(a.clone(), Operator::Gt, sum.clone())),
                        upper.clone(),
                    )],
                    Some(lit(ScalarValue::Utf8(Some("none".into())))),
                )
                .unwrap(),
            ),
            Arc::new(
                InListExpr::try_new(
                    a.clone(),
                    vec![
                        lit(ScalarValue::Int64(Some(1))),
                        lit(ScalarValue::Int64(None)),
                    ],
                    true,
                    &schema,
                )
                .unwrap(),
            ),
            Arc::new(LikeExpr::new(
                false,
                true,
                upper,
                lit(ScalarValue::Utf8(Some("A%".into()))),
            )),
            lit(ScalarValue::TimestampMicrosecond(
                Some(1_700_000_000_000_000),
                Some("+00:00".into()),
            )),
            lit(ScalarValue::Decimal128(Some(-12345), 20, 3)),
            Arc::new(VnodeOf::new(vec![a, s, col("t", 2)])),
        ];
        for e in &exprs {
            let read = round_trip(e);
            assert_eq!(read.to_string(), e.to_string());
            assert_eq!(
                read.data_type(&schema).unwrap(),
                e.data_type(&schema).unwrap()
            );
        }
    }

    #[test]
    fn a_deep_expression_is_stored_flat_and_without_recursion() {
        let mut e = col("a", 0);
        for i in 0..20_000 {
            e = Arc::new(BinaryExpr::new(
                e,
                Operator::Plus,
                lit(ScalarValue::Int64(Some(i))),
            ));
        }
        let stored = StoredExpr::encode(&e).unwrap();
        // serde_json refuses nesting deeper than 128 levels: a flat list reads back.
        let json = serde_json::to_string(&stored).unwrap();
        let read: StoredExpr = serde_json::from_str(&json).unwrap();
        let read = read.decode(&schema(), &Builtins).unwrap();
        assert_eq!(StoredExpr::encode(&read).unwrap().nodes(), stored.nodes());
        // Dropping a chain this deep recurses in Arc's destructors: leave them to the end of
        // the process.
        std::mem::forget((e, read));
    }

    #[test]
    fn a_shared_subexpression_is_stored_once() {
        let sum = Arc::new(BinaryExpr::new(col("a", 0), Operator::Plus, col("a", 0)))
            as Arc<dyn PhysicalExpr>;
        let twice = Arc::new(BinaryExpr::new(sum.clone(), Operator::Multiply, sum))
            as Arc<dyn PhysicalExpr>;
        // a, a, a + a, (a + a) * (a + a): the two columns are two nodes, the sum one.
        assert_eq!(StoredExpr::encode(&twice).unwrap().nodes(), 4);
        assert_eq!(round_trip(&twice).to_string(), twice.to_string());
    }

    fn plan() -> Compiled {
        let schema = schema();
        let root = PlanNode::Filter {
            input: Box::new(PlanNode::Input(0)),
            predicate: Arc::new(BinaryExpr::new(
                col("a", 0),
                Operator::Gt,
                lit(ScalarValue::Int64(Some(3))),
            )),
        };
        Compiled {
            inputs: vec![1000],
            schema: schema.clone(),
            fragments: vec![Fragment {
                root,
                sources: vec![Source::Relation {
                    input: 0,
                    keys: None,
                }],
                actors: 1,
            }],
        }
    }

    #[test]
    fn a_plan_reads_back_and_a_newer_or_damaged_one_is_refused() {
        let stored = plan().encode(&[schema()]).unwrap();
        let read = Compiled::decode(&stored, "v", &Builtins).unwrap();
        assert_eq!(read.inputs, vec![1000]);
        assert_eq!(read.schema, schema());
        let mut lines = Vec::new();
        read.fragments[0].root.explain(0, &["t".into()], &mut lines);
        assert_eq!(lines, ["Filter: a@0 > 3", "  Input: t"]);

        let mut newer = stored.clone();
        newer["format"] = (PLAN_FORMAT + 1).into();
        newer["fragments"] = "a shape this version does not know".into();
        let refused = Compiled::decode(&newer, "v", &Builtins).err().unwrap();
        assert_eq!(refused.kind, ErrorKind::NotSupported);

        // An operator naming a later one as its input: refused, not followed.
        let mut damaged = stored.clone();
        damaged["fragments"][0]["nodes"][1]["filter"]["input"] = 5.into();
        let refused = Compiled::decode(&damaged, "v", &Builtins).err().unwrap();
        assert_eq!(refused.kind, ErrorKind::DataCorruption);
        let mut damaged = stored;
        damaged["schema"] = "bm90IGFycm93".into();
        assert!(Compiled::decode(&damaged, "v", &Builtins).is_err());
    }

    /// Three fragments, each reading the next: the middle one's two actors split fragment 2's
    /// output by `a`.
    fn chain() -> Compiled {
        let filter = || PlanNode::Filter {
            input: Box::new(PlanNode::Input(0)),
            predicate: Arc::new(IsNullExpr::new(col("a", 0))),
        };
        let by_a = Keys {
            exprs: vec![col("a", 0)],
            types: vec![DataType::Int64],
        };
        let read = |fragment: usize, actor: usize, keys: Option<Keys>| Source::Fragment {
            fragment,
            actor,
            keys,
        };
        Compiled {
            inputs: vec![1000],
            schema: schema(),
            fragments: vec![
                Fragment {
                    root: PlanNode::Union {
                        inputs: vec![PlanNode::Input(0), PlanNode::Input(1)],
                        schema: schema(),
                    },
                    sources: vec![read(1, 0, None), read(1, 1, None)],
                    actors: 1,
                },
                Fragment {
                    root: filter(),
                    sources: vec![read(2, 0, Some(by_a))],
                    actors: 2,
                },
                Fragment {
                    root: filter(),
                    sources: vec![Source::Relation {
                        input: 0,
                        keys: None,
                    }],
                    actors: 1,
                },
            ],
        }
    }

    fn source_keys(plan: &Compiled) -> Vec<Vec<Option<String>>> {
        plan.fragments
            .iter()
            .map(|f| {
                f.sources
                    .iter()
                    .map(|s| match s {
                        Source::Relation { keys, .. } | Source::Fragment { keys, .. } => {
                            keys.as_ref().map(|k| {
                                let exprs: Vec<String> =
                                    k.exprs.iter().map(|e| e.to_string()).collect();
                                exprs.join(", ")
                            })
                        }
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn each_reader_keeps_its_own_keys_and_a_format_2_plan_gives_them_from_the_fragment_read() {
        let want = vec![vec![None, None], vec![Some("a@0".to_string())], vec![None]];
        let stored = chain().encode(&[schema()]).unwrap();
        let read = Compiled::decode(&stored, "v", &Builtins).unwrap();
        assert_eq!(source_keys(&read), want);

        // Format 2 kept the keys on the fragment read, for its one reader.
        let mut older = stored;
        older["format"] = 2.into();
        let keys = older["fragments"][1]["sources"][0]["fragment"]
            .as_object_mut()
            .unwrap()
            .remove("keys")
            .unwrap();
        older["fragments"][2]["output"] = keys;
        let read = Compiled::decode(&older, "v", &Builtins).unwrap();
        assert_eq!(source_keys(&read), want);
    }

    #[test]
    fn a_function_this_version_lacks_is_refused_by_name() {
        let e = Arc::new(
            ScalarFunctionExpr::try_new(
                datafusion::functions::string::lower(),
                vec![col("s", 1)],
                &schema(),
                Arc::new(ConfigOptions::default()),
            )
            .unwrap(),
        ) as Arc<dyn PhysicalExpr>;
        let stored = StoredExpr::encode(&e).unwrap();
        let refused = stored.decode(&schema(), &Builtins).err().unwrap();
        assert_eq!(refused.kind, ErrorKind::UndefinedFunction);
    }
}
