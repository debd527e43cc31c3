//! Plan rewrites that make DataFusion compute what PostgreSQL computes.

use std::sync::Arc;

use datafusion::arrow::datatypes::DataType;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Column, DFSchema, ScalarValue};
use datafusion::logical_expr::expr::Cast;
use datafusion::logical_expr::expr_rewriter::NamePreserver;
use datafusion::logical_expr::{
    Expr, ExprSchemable, JoinType, LogicalPlan, LogicalPlanBuilder, RecursiveQuery, Union,
};
use datafusion::optimizer::AnalyzerRule;

/// Semantics PostgreSQL has and DataFusion's plans lack:
/// - a scalar subquery over a relation known to be empty is NULL (`empty_subquery`);
/// - casting a numeric to an integer rounds (half away from zero) where Arrow's cast
///   truncates: `CAST(x AS int)` becomes `CAST(round(x) AS int)` when `x` is a decimal (so
///   inserting 2.5 into an integer column stores 3);
/// - `floor` and `ceil` of a numeric have no fractional digits (`floor(75.50)` is `75`, not
///   `75.00`);
/// - text cast to an interval may use clock notation (`'04:05:06'`), also where the cast is
///   implicit, as when such text is inserted into an interval column.
#[derive(Debug)]
pub struct PgSemantics;

impl AnalyzerRule for PgSemantics {
    fn analyze(
        &self,
        plan: LogicalPlan,
        _config: &ConfigOptions,
    ) -> datafusion::error::Result<LogicalPlan> {
        rewrite_expressions(plan, |e, schema| {
            let t = empty_subquery(e)?;
            if t.transformed {
                return Ok(t);
            }
            let t = round_before_cast(t.data, schema)?;
            if t.transformed {
                return Ok(t);
            }
            let t = integral_floor_ceil(t.data, schema)?;
            if t.transformed {
                return Ok(t);
            }
            interval_text(t.data)
        })
    }

    fn name(&self) -> &str {
        "pg_semantics"
    }
}

/// Rewrites every expression of every node of `plan` (subqueries included), bottom up, with
/// `rewrite`, which sees each sub-expression and the schema of the node's inputs (expressions
/// are typed against them; a node without inputs, VALUES, holds only constants). Every
/// expression keeps its output name: the plan's schema must not change.
pub(super) fn rewrite_expressions(
    plan: LogicalPlan,
    rewrite: impl Fn(Expr, &DFSchema) -> datafusion::error::Result<Transformed<Expr>>,
) -> datafusion::error::Result<LogicalPlan> {
    plan.transform_up_with_subqueries(|node| {
        let mut schema = DFSchema::empty();
        for input in node.inputs() {
            schema.merge(input.schema());
        }
        let names = NamePreserver::new(&node);
        node.map_expressions(|e| {
            let saved = names.save(&e);
            let rewritten = e.transform_up(|e| rewrite(e, &schema))?;
            Ok(rewritten.update_data(|e| saved.restore(e)))
        })
    })
    .map(|t| t.data)
}

fn round_before_cast(e: Expr, schema: &DFSchema) -> datafusion::error::Result<Transformed<Expr>> {
    let Expr::Cast(Cast { expr, field }) = &e else {
        return Ok(Transformed::no(e));
    };
    let to_integer = matches!(
        field.data_type(),
        DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64
    );
    let from_decimal = matches!(
        expr.get_type(schema),
        Ok(DataType::Decimal128(..) | DataType::Decimal256(..))
    );
    if !(to_integer && from_decimal) {
        return Ok(Transformed::no(e));
    }
    let rounded = datafusion::functions::math::round().call(vec![expr.as_ref().clone()]);
    Ok(Transformed::yes(Expr::Cast(Cast::new_from_field(
        Box::new(rounded),
        field.clone(),
    ))))
}

fn integral_floor_ceil(e: Expr, schema: &DFSchema) -> datafusion::error::Result<Transformed<Expr>> {
    let Expr::ScalarFunction(f) = &e else {
        return Ok(Transformed::no(e));
    };
    if !matches!(f.func.name(), "floor" | "ceil") || f.args.len() != 1 {
        return Ok(Transformed::no(e));
    }
    match f.args[0].get_type(schema) {
        Ok(DataType::Decimal128(p, s)) if s > 0 => Ok(Transformed::yes(Expr::Cast(Cast::new(
            Box::new(e),
            DataType::Decimal128(p, 0),
        )))),
        _ => Ok(Transformed::no(e)),
    }
}

fn interval_text(e: Expr) -> datafusion::error::Result<Transformed<Expr>> {
    let Expr::Cast(Cast { expr, field }) = &e else {
        return Ok(Transformed::no(e));
    };
    if !matches!(field.data_type(), DataType::Interval(_)) {
        return Ok(Transformed::no(e));
    }
    let Expr::Literal(ScalarValue::Utf8(Some(text)), meta) = expr.as_ref() else {
        return Ok(Transformed::no(e));
    };
    match crate::types::normalize_interval_text(text) {
        Some(n) => Ok(Transformed::yes(Expr::Cast(Cast::new_from_field(
            Box::new(Expr::Literal(ScalarValue::Utf8(Some(n)), meta.clone())),
            field.clone(),
        )))),
        None => Ok(Transformed::no(e)),
    }
}

/// Levels of operators between two typed casts in a long chain (`TypedChains`).
const CHAIN_STRIDE: usize = 8;

/// Long chains (`1 + 1 + ...`, `x = 1 OR x = 2 OR ...`, `- - ... x`) typed in linear time.
/// DataFusion works out an operator's type from its operands' types, recursively, at every
/// operator it coerces, simplifies or plans: quadratic in a chain's length (a sum of 10 000
/// terms took over a minute to plan). Here the operand of an operator that has
/// `CHAIN_STRIDE` or more levels of operators below it is wrapped in a cast to its own type,
/// which DataFusion reads without recursion; such a cast changes no value. Runs before
/// DataFusion's analyzer rules, and only deep chains change.
#[derive(Debug)]
pub struct TypedChains;

impl AnalyzerRule for TypedChains {
    fn analyze(
        &self,
        plan: LogicalPlan,
        _config: &ConfigOptions,
    ) -> datafusion::error::Result<LogicalPlan> {
        // Text compared with an array is read in the same pass (`array_text`).
        rewrite_expressions(plan, |e, schema| {
            array_text(e, schema)?.transform_data(|e| typed_chain(e, schema))
        })
    }

    fn name(&self) -> &str {
        "typed_chains"
    }
}

/// An operator's operands with `CHAIN_STRIDE` or more levels of operators below them, cast to
/// their own types.
fn typed_chain(e: Expr, schema: &DFSchema) -> datafusion::error::Result<Transformed<Expr>> {
    if !matches!(e, Expr::BinaryExpr(_) | Expr::Negative(_)) {
        return Ok(Transformed::no(e));
    }
    e.map_children(|operand| {
        if operator_levels(&operand, CHAIN_STRIDE) < CHAIN_STRIDE {
            return Ok(Transformed::no(operand));
        }
        // An operand whose type cannot be worked out here (a parameter) stays as it is.
        match operand.get_type(schema) {
            Ok(t) => Ok(Transformed::yes(Expr::Cast(Cast::new(
                Box::new(operand),
                t,
            )))),
            Err(_) => Ok(Transformed::no(operand)),
        }
    })
}

/// The levels of binary and unary minus operators from `e` down to the nearest cast, column
/// or other expression in each branch, counted up to `max`.
fn operator_levels(e: &Expr, max: usize) -> usize {
    if max == 0 {
        return 0;
    }
    match e {
        Expr::BinaryExpr(b) => {
            1 + operator_levels(&b.left, max - 1).max(operator_levels(&b.right, max - 1))
        }
        Expr::Negative(inner) => 1 + operator_levels(inner, max - 1),
        _ => 0,
    }
}

/// Types integer constants as PostgreSQL types them: `integer` when the value fits in 32
/// bits, else `bigint` (DataFusion reads every integer constant as `bigint`). So `int_col + 1`
/// is `integer` arithmetic and overflows (22003) where PostgreSQL's does, `SELECT 100000 *
/// 100000` is refused as it is there, and `SELECT 1` answers an `integer`. Applied to a plan
/// as DataFusion's SQL planner made it, before any analyzer rule (type coercion then casts
/// such constants wherever a wider type is needed), so that the plan's schema is the result's
/// from the start: a prepared statement's description needs no analysis. LIMIT and OFFSET
/// (which DataFusion reads as `bigint`) and VALUES lists (typed when planned; an INSERT casts
/// them to its columns) keep their constants.
pub fn type_integer_constants(plan: LogicalPlan) -> datafusion::error::Result<LogicalPlan> {
    plan.transform_up_with_subqueries(|node| {
        if matches!(node, LogicalPlan::Limit(_) | LogicalPlan::Values(_)) {
            return Ok(Transformed::no(node));
        }
        let names = NamePreserver::new(&node);
        node.map_expressions(|e| {
            let saved = names.save(&e);
            let narrowed = e.transform_up(|e| match e {
                Expr::Literal(ScalarValue::Int64(Some(v)), meta) => match i32::try_from(v) {
                    Ok(v) => Ok(Transformed::yes(Expr::Literal(
                        ScalarValue::Int32(Some(v)),
                        meta,
                    ))),
                    Err(_) => Ok(Transformed::no(Expr::Literal(
                        ScalarValue::Int64(Some(v)),
                        meta,
                    ))),
                },
                e => Ok(Transformed::no(e)),
            })?;
            Ok(narrowed.update_data(|e| saved.restore(e)))
        })?
        // Types below may have changed too: every node's schema follows its inputs'.
        .map_data(|node| match node {
            // A UNION's columns are of its inputs' types when they agree (`int4_col - 1
            // UNION ALL int2_col - 1` is `integer`); else as planned, for the analyzer to
            // coerce.
            LogicalPlan::Union(u) => union_of_agreeing_types(u).map(LogicalPlan::Union),
            LogicalPlan::RecursiveQuery(q) => recursive_of_one_type(q),
            node => node.recompute_schema(),
        })
    })
    .map(|t| t.data)
}

/// A recursive query whose static term is cast to the types of its recursive term where
/// they differ: the recursive term reads the work table as planned (integer constants as
/// `bigint`), while the static term's own constants were narrowed (`WITH RECURSIVE t(n) AS
/// (SELECT 1 UNION ALL SELECT n + 1 FROM t ...)`).
fn recursive_of_one_type(mut q: RecursiveQuery) -> datafusion::error::Result<LogicalPlan> {
    let given = q.static_term.schema().clone();
    let wanted = q.recursive_term.schema().clone();
    let differ = (given.fields().iter().zip(wanted.fields().iter()))
        .any(|(g, w)| g.data_type() != w.data_type());
    if differ && given.fields().len() == wanted.fields().len() {
        let columns = (given.iter().zip(wanted.fields().iter())).map(|((qualifier, g), w)| {
            let column = Expr::Column(Column::new(qualifier.cloned(), g.name()));
            match g.data_type() == w.data_type() {
                true => column,
                false => Expr::Cast(Cast::new(Box::new(column), w.data_type().clone()))
                    .alias_qualified(qualifier.cloned(), g.name()),
            }
        });
        let cast = LogicalPlanBuilder::from(q.static_term.as_ref().clone())
            .project(columns)?
            .build()?;
        q.static_term = Arc::new(cast);
    }
    LogicalPlan::RecursiveQuery(q).recompute_schema()
}

/// `u` with each column of the type all its inputs give it, where they agree (the analyzer
/// coerces the others).
fn union_of_agreeing_types(u: Union) -> datafusion::error::Result<Union> {
    let fields = (u.schema.iter().enumerate())
        .map(|(i, (qualifier, field))| {
            let types: Vec<&DataType> = (u.inputs.iter())
                .filter_map(|input| input.schema().fields().get(i).map(|f| f.data_type()))
                .collect();
            let agreed = (types.len() == u.inputs.len())
                .then(|| types.first().copied())
                .flatten()
                .filter(|t| types.iter().all(|other| other == t));
            let field = match agreed {
                Some(t) if t != field.data_type() => {
                    Arc::new(field.as_ref().clone().with_data_type(t.clone()))
                }
                _ => field.clone(),
            };
            (qualifier.cloned(), field)
        })
        .collect();
    let schema = DFSchema::new_with_metadata(fields, u.schema.metadata().clone())?;
    Ok(Union {
        inputs: u.inputs,
        schema: Arc::new(schema),
    })
}

/// The rules every Weir context runs before DataFusion's own analyzer rules.
pub fn early_analyzer_rules() -> Vec<Arc<dyn AnalyzerRule + Send + Sync>> {
    vec![Arc::new(TypedChains)]
}

/// A text constant compared with an array is read as an array of the other side's element
/// type, as PostgreSQL reads an untyped constant: `polroles = '{0}'` (a catalog query psql
/// sends). Only one-dimensional arrays of unquoted elements are read; other text stays text
/// (and the comparison is refused as before). Part of `TypedChains`' pass, before DataFusion
/// coerces types.
fn array_text(e: Expr, schema: &DFSchema) -> datafusion::error::Result<Transformed<Expr>> {
    let Expr::BinaryExpr(b) = &e else {
        return Ok(Transformed::no(e));
    };
    let array = |side: &Expr, other: &Expr| match (side.get_type(schema), other) {
        (Ok(DataType::List(element)), Expr::Literal(ScalarValue::Utf8(Some(t)), _)) => {
            array_from_text(t, element.data_type())
        }
        _ => None,
    };
    let mut b = b.clone();
    if let Some(a) = array(&b.left, &b.right) {
        b.right = Box::new(Expr::Literal(a, None));
    } else if let Some(a) = array(&b.right, &b.left) {
        b.left = Box::new(Expr::Literal(a, None));
    } else {
        return Ok(Transformed::no(e));
    }
    Ok(Transformed::yes(Expr::BinaryExpr(b)))
}

/// `{1,2,NULL}` as a list of `element`s.
fn array_from_text(text: &str, element: &DataType) -> Option<ScalarValue> {
    let inner = text.trim().strip_prefix('{')?.strip_suffix('}')?;
    if inner.contains(['{', '"', '\\']) {
        return None;
    }
    let values = (inner
        .split(',')
        .filter(|v| !inner.trim().is_empty() || !v.is_empty()))
    .map(|v| match v.trim() {
        n if n.eq_ignore_ascii_case("null") => ScalarValue::try_from(element).ok(),
        v => ScalarValue::try_from_string(v.to_string(), element).ok(),
    })
    .collect::<Option<Vec<_>>>()?;
    Some(ScalarValue::List(ScalarValue::new_list_nullable(
        &values, element,
    )))
}

/// The rules every Weir context runs after DataFusion's own analyzer rules.
pub fn analyzer_rules() -> Vec<Arc<dyn AnalyzerRule + Send + Sync>> {
    vec![
        Arc::new(PgSemantics),
        Arc::new(super::checked::FoldIntegers),
    ]
}

/// A scalar subquery that reads a relation known to be empty (a catalog table of a feature
/// Weir lacks, planned as an empty relation) is NULL, as it would evaluate to: so a
/// correlated one that DataFusion could not run (SQLAlchemy's column reflection reads
/// `pg_sequence` with the outer row in its SELECT list) is planned away. Part of
/// `PgSemantics`' pass, after DataFusion has inlined such tables.
fn empty_subquery(e: Expr) -> datafusion::error::Result<Transformed<Expr>> {
    match &e {
        Expr::ScalarSubquery(s) if without_rows(&s.subquery) || single_of_none(&s.subquery) => {
            let t = s.subquery.schema().field(0).data_type().clone();
            Ok(Transformed::yes(Expr::Literal(
                ScalarValue::try_from(&t)?,
                None,
            )))
        }
        _ => Ok(Transformed::no(e)),
    }
}

/// Whether `plan` is a column of `weir_single` (a correlated scalar subquery as the catalog
/// rewrite plans it) over no rows: NULL.
fn single_of_none(plan: &LogicalPlan) -> bool {
    match plan {
        LogicalPlan::Projection(p) => {
            let column = |e: &Expr| match e {
                Expr::Alias(a) => matches!(a.expr.as_ref(), Expr::Column(_)),
                e => matches!(e, Expr::Column(_)),
            };
            p.expr.iter().all(column) && single_of_none(&p.input)
        }
        LogicalPlan::SubqueryAlias(a) => single_of_none(&a.input),
        LogicalPlan::Aggregate(a) => {
            let single = |e: &Expr| match e {
                Expr::Alias(alias) => matches!(alias.expr.as_ref(),
                    Expr::AggregateFunction(f) if f.func.name() == super::pg_compat::SINGLE),
                Expr::AggregateFunction(f) => f.func.name() == super::pg_compat::SINGLE,
                _ => false,
            };
            a.group_expr.is_empty() && a.aggr_expr.iter().all(single) && without_rows(&a.input)
        }
        _ => false,
    }
}

/// Whether `plan` has no rows whatever its input: an empty relation under operators that
/// keep no row of an empty input (not an aggregate, which has one row without input).
fn without_rows(plan: &LogicalPlan) -> bool {
    let mut node = plan;
    loop {
        node = match node {
            LogicalPlan::EmptyRelation(e) => return !e.produce_one_row,
            LogicalPlan::Projection(p) => &p.input,
            LogicalPlan::Filter(f) => &f.input,
            LogicalPlan::SubqueryAlias(a) => &a.input,
            LogicalPlan::Sort(s) => &s.input,
            LogicalPlan::Limit(l) => &l.input,
            LogicalPlan::Join(j) => match j.join_type {
                JoinType::Inner => return without_rows(&j.left) || without_rows(&j.right),
                JoinType::Left | JoinType::LeftSemi | JoinType::LeftAnti => &j.left,
                JoinType::Right | JoinType::RightSemi | JoinType::RightAnti => &j.right,
                _ => return false,
            },
            _ => return false,
        };
    }
}
