//! The names PostgreSQL gives a query's result columns (`count`, not DataFusion's
//! `count(*)`; `?column?` for an expression), for query results and a view's columns, and the
//! types a column's Arrow type does not tell (`varchar(n)`, `name`), which fields carry.

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::ScalarValue;
use datafusion::datasource::source_as_provider;
use datafusion::logical_expr::{Expr, ExprSchemable, LogicalPlan};

use super::provider::RelationTable;

/// A query's result columns as a client sees them: the plan's types under PostgreSQL's
/// column names (`count`, not DataFusion's `count(*)`).
/// A column read straight from a relation carries, in its field's metadata, the relation's
/// OID, its attribute number, and its declared type and modifier (`TABLE_OID` ...), for the
/// client's description of the result (pgJDBC's `ResultSetMetaData`, a `varchar(20)`).
pub fn result_schema(plan: &LogicalPlan) -> SchemaRef {
    let schema = plan.schema().as_arrow();
    let names = pg_names(plan).filter(|n| n.len() == schema.fields().len());
    let fields = (schema.fields().iter().enumerate()).map(|(i, f)| {
        let mut f = f.as_ref().clone();
        if let Some(name) = names.as_ref().and_then(|n| n.get(i)) {
            f = f.with_name(name.clone());
        }
        if let Some((oid, column, (type_oid, typmod))) = origin(plan, i) {
            let metadata = [
                (TABLE_OID, oid.to_string()),
                (ATTNUM, (column + 1).to_string()),
                (TYPE_OID, type_oid.to_string()),
                (TYPMOD, typmod.to_string()),
            ];
            f = f.with_metadata(
                metadata
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v))
                    .collect(),
            );
        } else if let Some(oid) = declared_type(plan, i) {
            f = f.with_metadata([(TYPE_OID.to_string(), oid)].into());
        }
        // PostgreSQL has no unsigned `bigint`: `row_number()`, `rank()` and `dense_rank()`
        // (DataFusion's are unsigned) are `bigint`, and their rows are cast as they go out.
        if *f.data_type() == DataType::UInt64 {
            f = f.with_data_type(DataType::Int64);
        }
        f
    });
    Arc::new(Schema::new(fields.collect::<Vec<_>>()))
}

/// The declared PostgreSQL type (`TYPE_OID`'s value) of `plan`'s column `i` when its field
/// does not carry one because an expression computed it from values that did: a `CASE` whose
/// branches are all of one declared type, `nullif` and `coalesce` of a `"char"` column, a
/// scalar subquery's value (SQLAlchemy's `json_build_object`, pgJDBC's `nullif(attidentity,
/// '')`), looked for through projections, subquery aliases, filters, sorts, limits and the
/// aggregates that pass a value on (`min`, `max`, a correlated subquery's `weir_single`).
fn declared_type(plan: &LogicalPlan, i: usize) -> Option<String> {
    let field = plan.schema().fields().get(i)?;
    if let Some(oid) = field.metadata().get(TYPE_OID) {
        return Some(oid.clone());
    }
    match plan {
        LogicalPlan::Projection(p) => declared_expr(p.expr.get(i)?, &p.input),
        LogicalPlan::SubqueryAlias(a) => declared_type(&a.input, i),
        LogicalPlan::Filter(f) => declared_type(&f.input, i),
        LogicalPlan::Sort(s) => declared_type(&s.input, i),
        LogicalPlan::Limit(l) => declared_type(&l.input, i),
        LogicalPlan::Aggregate(a) => match i.checked_sub(a.group_expr.len()) {
            None => declared_expr(a.group_expr.get(i)?, &a.input),
            // A correlated scalar subquery's one value (`weir_single`), a least or greatest.
            Some(j) => match a.aggr_expr.get(j)? {
                Expr::Alias(alias) => declared_aggregate(&alias.expr, &a.input),
                e => declared_aggregate(e, &a.input),
            },
        },
        _ => None,
    }
}

/// The declared type an aggregate passes on from its argument.
fn declared_aggregate(e: &Expr, input: &LogicalPlan) -> Option<String> {
    match e {
        Expr::AggregateFunction(f) if matches!(f.func.name(), "weir_single" | "min" | "max") => {
            declared_expr(f.params.args.first()?, input)
        }
        _ => None,
    }
}

/// The declared type of `e`'s values over `input`, as [`declared_type`] finds it.
fn declared_expr(e: &Expr, input: &LogicalPlan) -> Option<String> {
    match e {
        Expr::Alias(a) => declared_expr(&a.expr, input),
        Expr::Column(c) => declared_type(input, input.schema().index_of_column(c).ok()?),
        Expr::ScalarSubquery(s) => declared_type(&s.subquery, 0),
        Expr::ScalarFunction(f) if matches!(f.func.name(), "nullif" | "coalesce") => {
            declared_expr(f.args.first()?, input)
        }
        Expr::Case(c) => {
            let branches = (c.when_then_expr.iter().map(|(_, then)| then.as_ref()))
                .chain(c.else_expr.as_deref())
                .filter(|e| !matches!(e, Expr::Literal(v, _) if v.is_null()));
            let mut declared = None;
            for branch in branches {
                let oid = declared_expr(branch, input)?;
                if declared.get_or_insert_with(|| oid.clone()) != &oid {
                    return None;
                }
            }
            declared
        }
        // A function whose values are of a declared type (`json_build_object`).
        e => {
            let (_, field) = e.to_field(input.schema()).ok()?;
            field.metadata().get(TYPE_OID).cloned()
        }
    }
}

/// `field` of the PostgreSQL type `oid`, which its Arrow type does not tell (text that is
/// `name`), as the client is told.
pub fn declared(field: Field, oid: u32) -> Field {
    field.with_metadata([(TYPE_OID.to_string(), oid.to_string())].into())
}

/// The declared type (`TYPE_OID` and `TYPMOD`) a result column's metadata carries, without
/// the relation it was read from: what a view's column keeps of its input's.
pub fn declared_type_of(field: &Field) -> std::collections::HashMap<String, String> {
    (field.metadata().iter())
        .filter(|(k, _)| *k == TYPE_OID || *k == TYPMOD)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// PostgreSQL's `name`, the type of the catalogs' identifiers.
pub const NAME_OID: u32 = 19;
/// PostgreSQL's `"char"`, one byte: the catalogs' kinds and flags (`relkind`).
pub const CHAR_OID: u32 = 18;

/// The metadata keys of a result column read straight from a relation.
pub const TABLE_OID: &str = "weir.table_oid";
pub const ATTNUM: &str = "weir.attnum";
pub const TYPE_OID: &str = "weir.type_oid";
pub const TYPMOD: &str = "weir.typmod";

/// The relation, column position and declared type of `plan`'s column `i`, when it is a
/// relation's column passed through unchanged.
fn origin(plan: &LogicalPlan, i: usize) -> Option<(u32, usize, (u32, i32))> {
    let (mut node, mut i) = (plan, i);
    loop {
        (node, i) = match node {
            LogicalPlan::Projection(p) => {
                let column = match p.expr.get(i)? {
                    Expr::Column(c) => c,
                    Expr::Alias(a) => match a.expr.as_ref() {
                        Expr::Column(c) => c,
                        _ => return None,
                    },
                    _ => return None,
                };
                (
                    p.input.as_ref(),
                    p.input.schema().index_of_column(column).ok()?,
                )
            }
            LogicalPlan::Filter(f) => (f.input.as_ref(), i),
            LogicalPlan::Sort(s) => (s.input.as_ref(), i),
            LogicalPlan::Limit(l) => (l.input.as_ref(), i),
            LogicalPlan::SubqueryAlias(a) => (a.input.as_ref(), i),
            // A grouping column is its input's, as PostgreSQL describes it.
            LogicalPlan::Aggregate(a) => match a.group_expr.get(i)? {
                Expr::Column(c) => (a.input.as_ref(), a.input.schema().index_of_column(c).ok()?),
                _ => return None,
            },
            LogicalPlan::TableScan(scan) => {
                let column = match &scan.projection {
                    Some(projection) => *projection.get(i)?,
                    None => i,
                };
                let provider = source_as_provider(&scan.source).ok()?;
                let origin = provider.downcast_ref::<RelationTable>()?.origin.as_ref()?;
                return Some((origin.oid, column, *origin.columns.get(column)?));
            }
            _ => return None,
        };
    }
}

/// The prefix of the alias the catalog rewrite gives an unnamed expression whose DataFusion
/// name another column of its SELECT already has (`SELECT NULL, NULL`): the column is named
/// as if it had none.
pub const UNNAMED: &str = "?column?#";

pub fn pg_names(plan: &LogicalPlan) -> Option<Vec<String>> {
    match plan {
        LogicalPlan::Projection(p) => Some(
            p.expr
                .iter()
                .map(|e| {
                    // A column that names an aggregate's output, possibly under the alias
                    // DataFusion gives it (`count(Int64(1)) AS count(*)`): name it after the
                    // aggregate. An alias without parentheses is the user's own.
                    let column = match e {
                        Expr::Column(c) => Some(c),
                        Expr::Alias(a) if a.name.contains('(') => match a.expr.as_ref() {
                            Expr::Column(c) => Some(c),
                            _ => None,
                        },
                        _ => None,
                    };
                    match column.and_then(|c| produced_by(&p.input, &c.name)) {
                        Some(Expr::Alias(a)) => pg_column_name(&a.expr),
                        Some(produced) => pg_column_name(produced),
                        None => pg_column_name(e),
                    }
                })
                .collect(),
        ),
        LogicalPlan::Sort(s) => pg_names(&s.input),
        // A set operation's columns are named by its first query.
        LogicalPlan::Union(u) => pg_names(u.inputs.first()?),
        LogicalPlan::Distinct(d) => pg_names(d.input()),
        LogicalPlan::Limit(l) => pg_names(&l.input),
        _ => None,
    }
}

/// The expression of `plan` (looking through filters) whose output column is `name`.
fn produced_by<'a>(plan: &'a LogicalPlan, name: &str) -> Option<&'a Expr> {
    match plan {
        LogicalPlan::Aggregate(a) => a
            .group_expr
            .iter()
            .chain(&a.aggr_expr)
            .find(|e| e.schema_name().to_string() == name),
        LogicalPlan::Filter(f) => produced_by(&f.input, name),
        _ => None,
    }
}

/// Whether an alias is DataFusion's name for the expression as planned, kept when integer
/// constants were narrowed (`Int32(1) AS "Int64(1)"`), not a name the query gave.
fn is_datafusion_name(a: &datafusion::logical_expr::expr::Alias) -> bool {
    let planned = a.expr.schema_name().to_string();
    planned.contains("Int32(") && planned.replace("Int32(", "Int64(") == a.name
}

/// PostgreSQL's name for an output column: the alias, the column name, the function name, or
/// `?column?`.
pub fn pg_column_name(e: &Expr) -> String {
    match e {
        Expr::Alias(a) if a.name.starts_with(UNNAMED) || is_datafusion_name(a) => {
            pg_column_name(&a.expr)
        }
        Expr::Alias(a) => a.name.clone(),
        Expr::Column(c) => c.name.clone(),
        // A record's field, `(keys).x`, is named after the field.
        Expr::ScalarFunction(f) if f.func.name() == "get_field" => match f.args.get(1) {
            Some(Expr::Literal(ScalarValue::Utf8(Some(field)), _)) => field.clone(),
            _ => "get_field".to_string(),
        },
        Expr::ScalarFunction(f) => f.func.name().to_string(),
        Expr::AggregateFunction(f) => f.func.name().to_string(),
        Expr::Cast(c) => match c.expr.as_ref() {
            inner @ (Expr::Column(_) | Expr::ScalarFunction(_) | Expr::AggregateFunction(_)) => {
                pg_column_name(inner)
            }
            _ => "?column?".to_string(),
        },
        Expr::Case(_) => "case".to_string(),
        _ => "?column?".to_string(),
    }
}
