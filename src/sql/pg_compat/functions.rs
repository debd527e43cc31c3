//! The catalog functions psql, drivers and tools call (`format_type`, `pg_get_viewdef`,
//! `pg_table_is_visible`, the `::regclass` casts' functions ...) over a query's [`Relations`],
//! and `weir_single`, the aggregate a correlated scalar subquery is planned with.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray};
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, UInt64Type};
use datafusion::common::ScalarValue;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::utils::format_state_name;
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, ColumnarValue, ReturnFieldArgs,
    ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use datafusion::prelude::SessionContext;

use crate::sql::names::{CHAR_OID, NAME_OID};
use crate::sql::pg_catalog::{self, Relations, NAMESPACES};

/// A catalog function's body: its value for the arguments' values of one row.
type Body = dyn Fn(&[ScalarValue]) -> DfResult<ScalarValue> + Send + Sync;

/// A catalog function: its name, return type (from its arguments' types), the numbers of
/// arguments it takes, and its body over the arguments' values, a row at a time.
pub(super) struct CatalogFn {
    name: &'static str,
    signature: Signature,
    arity: std::ops::RangeInclusive<usize>,
    returns: fn(&[DataType]) -> DataType,
    /// The PostgreSQL type of its values when Arrow's does not tell it (`name`, `json`).
    declared: Option<u32>,
    body: Arc<Body>,
}

impl CatalogFn {
    /// The function's values are of the PostgreSQL type `oid`, which the client is told.
    pub(super) fn declared(mut self, oid: u32) -> CatalogFn {
        self.declared = Some(oid);
        self
    }
}

impl std::fmt::Debug for CatalogFn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

impl PartialEq for CatalogFn {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

impl Eq for CatalogFn {}

impl std::hash::Hash for CatalogFn {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.name.hash(state)
    }
}

impl ScalarUDFImpl for CatalogFn {
    fn name(&self) -> &str {
        self.name
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> DfResult<DataType> {
        if !self.arity.contains(&args.len()) {
            return Err(DataFusionError::Plan(format!(
                "function {}() does not take {} arguments",
                self.name,
                args.len()
            )));
        }
        Ok((self.returns)(args))
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> DfResult<FieldRef> {
        let types: Vec<DataType> = (args.arg_fields.iter())
            .map(|f| f.data_type().clone())
            .collect();
        let field = Field::new(self.name, self.return_type(&types)?, true);
        Ok(Arc::new(match self.declared {
            Some(oid) => crate::sql::names::declared(field, oid),
            None => field,
        }))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let rows = args.number_rows;
        let scalar = args
            .args
            .iter()
            .all(|a| matches!(a, ColumnarValue::Scalar(_)));
        let ret = args.return_field.data_type().clone();
        let value_at = |a: &ColumnarValue, i: usize| -> DfResult<ScalarValue> {
            match a {
                ColumnarValue::Scalar(s) => Ok(s.clone()),
                ColumnarValue::Array(array) => ScalarValue::try_from_array(array, i),
            }
        };
        let mut out = Vec::with_capacity(if scalar { 1 } else { rows });
        for i in 0..if scalar { 1 } else { rows } {
            let values: Vec<ScalarValue> = (args.args.iter())
                .map(|a| value_at(a, i))
                .collect::<DfResult<_>>()?;
            out.push((self.body)(&values)?.cast_to(&ret)?);
        }
        if scalar {
            return Ok(ColumnarValue::Scalar(out.remove(0)));
        }
        if out.is_empty() {
            return Ok(ColumnarValue::Array(
                datafusion::arrow::array::new_empty_array(&ret),
            ));
        }
        Ok(ColumnarValue::Array(ScalarValue::iter_to_array(out)?))
    }
}

/// A value as an OID: an integer, or text holding one.
pub(super) fn as_oid(v: &ScalarValue) -> Option<u32> {
    match v {
        ScalarValue::Utf8(Some(s)) | ScalarValue::LargeUtf8(Some(s)) => s.trim().parse().ok(),
        other if other.is_null() => None,
        other => other.cast_to(&DataType::Int64).ok().and_then(|v| match v {
            ScalarValue::Int64(Some(v)) => u32::try_from(v).ok(),
            _ => None,
        }),
    }
}

pub(super) fn as_text(v: &ScalarValue) -> Option<String> {
    match v {
        ScalarValue::Utf8(Some(s)) | ScalarValue::LargeUtf8(Some(s)) => Some(s.clone()),
        _ => None,
    }
}

fn is_text(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View | DataType::Null
    )
}

pub(super) fn text(v: Option<String>) -> ScalarValue {
    ScalarValue::Utf8(v)
}

/// The catalog functions over `relations`, registered in `ctx`, with `weir_single` and the
/// table functions planned over other relations' columns.
pub fn register_functions(ctx: &SessionContext, relations: &Arc<Relations>) {
    let functions = (over_relations(relations).into_iter())
        .chain(of_session(relations))
        .chain(super::privileges::privilege_functions(relations))
        .chain(fixed())
        .chain(super::strings::string_functions())
        .chain(super::arrays::array_functions());
    for function in functions.chain(of_values()) {
        ctx.register_udf(ScalarUDF::new_from_impl(function));
    }
    for function in pg_catalog::CatalogRows::all(relations) {
        ctx.register_udtf(function.name(), Arc::new(function));
    }
    for name in ["generate_series", "range"] {
        if let Ok(builtin) = ctx.table_function(name) {
            let builtin = builtin.function().clone();
            ctx.register_udtf(name, Arc::new(super::series::OverColumns { name, builtin }));
        }
    }
    ctx.register_udf(ScalarUDF::new_from_impl(super::arrays::ExpandArray::new()));
    ctx.register_udaf(AggregateUDF::new_from_impl(Single {
        signature: Signature::any(1, Volatility::Immutable),
    }));
}

pub(super) fn any() -> Signature {
    Signature::variadic_any(Volatility::Stable)
}

pub(super) fn to_text(_: &[DataType]) -> DataType {
    DataType::Utf8
}

pub(super) fn to_bool(_: &[DataType]) -> DataType {
    DataType::Boolean
}

fn to_bigint(_: &[DataType]) -> DataType {
    DataType::Int64
}

/// Text in, an OID out; an OID in, its name out.
fn lookup(args: &[DataType]) -> DataType {
    match args.first() {
        Some(t) if is_text(t) => DataType::UInt32,
        _ => DataType::Utf8,
    }
}

/// The functions that look names, OIDs and definitions up in `relations`.
fn over_relations(relations: &Arc<Relations>) -> Vec<CatalogFn> {
    let r = relations.clone();
    let regclass = move |v: &[ScalarValue]| -> DfResult<ScalarValue> {
        Ok(match as_text(&v[0]) {
            Some(name) => match (r.by_name(&name), name.trim().parse::<u32>()) {
                (Some(rel), _) => ScalarValue::UInt32(Some(rel.oid)),
                (None, Ok(oid)) => ScalarValue::UInt32(Some(oid)),
                (None, Err(_)) => {
                    return Err(DataFusionError::External(Box::new(
                        crate::error::Error::new(
                            crate::error::ErrorKind::UndefinedTable,
                            format!("relation \"{name}\" does not exist"),
                        ),
                    )))
                }
            },
            None => text(as_oid(&v[0]).map(|oid| {
                (r.by_oid(oid).map(|rel| pg_catalog::quote_ident(&rel.name)))
                    .or_else(|| r.by_key_oid(oid).map(|rel| rel.index_name()))
                    .unwrap_or_else(|| oid.to_string())
            })),
        })
    };
    let regtype = |v: &[ScalarValue]| -> DfResult<ScalarValue> {
        Ok(match as_text(&v[0]) {
            Some(name) => ScalarValue::UInt32(pg_catalog::type_oid(&name)),
            None => text(as_oid(&v[0]).map(|oid| pg_catalog::format_type(oid, -1))),
        })
    };
    let regnamespace = |v: &[ScalarValue]| -> DfResult<ScalarValue> {
        Ok(match as_text(&v[0]) {
            Some(name) => ScalarValue::UInt32(
                NAMESPACES
                    .iter()
                    .find(|(_, n)| *n == name)
                    .map(|(oid, _)| *oid),
            ),
            None => text(as_oid(&v[0]).map(|oid| {
                (NAMESPACES.iter().find(|(o, _)| *o == oid))
                    .map_or_else(|| oid.to_string(), |(_, n)| n.to_string())
            })),
        })
    };
    let r = relations.clone();
    let indexdef = move |v: &[ScalarValue]| -> DfResult<ScalarValue> {
        let Some(rel) = as_oid(&v[0]).and_then(|oid| r.by_key_oid(oid)) else {
            return Ok(text(None));
        };
        // `pg_get_indexdef(index, k, pretty)`: the definition of its k-th column alone.
        Ok(text(match v.get(1).and_then(as_oid_signed).unwrap_or(0) {
            0 => Some(pg_catalog::index_definition(rel)),
            k => (usize::try_from(k - 1).ok())
                .and_then(|k| rel.primary_key.get(k))
                .and_then(|&i| rel.columns.get(i))
                .map(|c| pg_catalog::quote_ident(&c.name)),
        }))
    };
    let r = relations.clone();
    let constraintdef = move |v: &[ScalarValue]| -> DfResult<ScalarValue> {
        let rel = as_oid(&v[0]).and_then(|oid| r.by_key_oid(oid));
        Ok(text(
            rel.map(|rel| format!("PRIMARY KEY {}", rel.key_list())),
        ))
    };
    let r = relations.clone();
    let viewdef = move |v: &[ScalarValue]| -> DfResult<ScalarValue> {
        let rel = match as_text(&v[0]) {
            Some(name) if name.trim().parse::<u32>().is_err() => r.by_name(&name),
            _ => as_oid(&v[0]).and_then(|oid| r.by_oid(oid)),
        };
        Ok(text(rel.and_then(|rel| rel.definition.clone())))
    };
    let format_type = |v: &[ScalarValue]| -> DfResult<ScalarValue> {
        let typmod = v.get(1).and_then(as_oid_signed).unwrap_or(-1);
        Ok(text(
            as_oid(&v[0]).map(|oid| pg_catalog::format_type(oid, typmod)),
        ))
    };
    let r = relations.clone();
    let userbyid = move |v: &[ScalarValue]| -> DfResult<ScalarValue> {
        Ok(text(as_oid(&v[0]).map(|oid| {
            (r.roles.iter().find(|role| role.oid == oid))
                .map_or_else(|| format!("unknown (OID={oid})"), |role| role.name.clone())
        })))
    };
    vec![
        f("pg_get_userbyid", any(), 1..=1, to_text, userbyid).declared(NAME_OID),
        f("format_type", any(), 2..=2, to_text, format_type),
        f("pg_get_indexdef", any(), 1..=3, to_text, indexdef),
        f("pg_get_constraintdef", any(), 1..=2, to_text, constraintdef),
        f("pg_get_viewdef", any(), 1..=2, to_text, viewdef),
        f("weir_regclass", any(), 1..=1, lookup, regclass),
        f("weir_regtype", any(), 1..=1, lookup, regtype),
        f("weir_regnamespace", any(), 1..=1, lookup, regnamespace),
    ]
}

/// The functions whose values do not depend on the catalog.
fn fixed() -> Vec<CatalogFn> {
    vec![
        // Weir has no sequences yet.
        f("pg_get_serial_sequence", any(), 2..=2, to_text, |_| {
            Ok(text(None))
        }),
        f("pg_collation_is_visible", any(), 1..=1, to_bool, visible),
        f("pg_opclass_is_visible", any(), 1..=1, to_bool, visible),
        f("json_build_object", any(), 0..=100, to_text, |v| {
            Ok(text(Some(json_object(v)?)))
        })
        .declared(JSON_OID),
        // The schemas a name is looked up in: `pg_catalog` (implicitly) and `public`.
        f(
            "current_schemas",
            any(),
            1..=1,
            |_| DataType::List(Arc::new(Field::new_list_field(DataType::Utf8, true))),
            |v| {
                let implicit = matches!(v[0], ScalarValue::Boolean(Some(true)));
                let names: &[&str] = match implicit {
                    true => &["pg_catalog", "public"],
                    false => &["public"],
                };
                let names: Vec<ScalarValue> = (names.iter())
                    .map(|n| ScalarValue::Utf8(Some(n.to_string())))
                    .collect();
                Ok(ScalarValue::List(ScalarValue::new_list_nullable(
                    &names,
                    &DataType::Utf8,
                )))
            },
        ),
        f("pg_table_is_visible", any(), 1..=1, to_bool, visible),
        f("pg_type_is_visible", any(), 1..=1, to_bool, visible),
        f("pg_function_is_visible", any(), 1..=1, to_bool, visible),
        f("pg_relation_is_publishable", any(), 1..=1, to_bool, |_| {
            Ok(ScalarValue::Boolean(Some(false)))
        }),
        f("pg_get_expr", any(), 2..=3, to_text, |_| Ok(text(None))),
        f("obj_description", any(), 1..=2, to_text, |_| Ok(text(None))),
        f("col_description", any(), 2..=2, to_text, |_| Ok(text(None))),
        f("shobj_description", any(), 2..=2, to_text, |_| {
            Ok(text(None))
        }),
        f(
            "pg_get_statisticsobjdef_columns",
            any(),
            1..=1,
            to_text,
            |_| Ok(text(None)),
        ),
        f("pg_get_function_result", any(), 1..=1, to_text, |_| {
            Ok(text(None))
        }),
        f("pg_get_function_arguments", any(), 1..=1, to_text, |_| {
            Ok(text(None))
        }),
        f("pg_encoding_to_char", any(), 1..=1, to_text, |_| {
            Ok(text(Some("UTF8".into())))
        })
        .declared(NAME_OID),
        f("weir_regproc", any(), 1..=1, to_text, |v| {
            Ok(text(
                as_text(&v[0]).or_else(|| as_oid(&v[0]).map(|o| o.to_string())),
            ))
        }),
        f(
            "weir_oid",
            any(),
            1..=1,
            |_| DataType::UInt32,
            |v| Ok(ScalarValue::UInt32(as_oid(&v[0]))),
        ),
        f("weir_text", any(), 1..=1, to_text, as_plain_text),
        f("weir_name", any(), 1..=1, to_text, as_plain_text).declared(NAME_OID),
        f("weir_char", any(), 1..=1, to_text, as_plain_text).declared(CHAR_OID),
    ]
}

/// Definitions Weir has none of, sizes, and values computed from the arguments' own.
fn of_values() -> Vec<CatalogFn> {
    vec![
        f("pg_get_ruledef", any(), 1..=2, to_text, |_| Ok(text(None))),
        // Weir has no partitioned tables.
        f("pg_get_partkeydef", any(), 1..=1, to_text, |_| {
            Ok(text(None))
        }),
        // Nor access statistics: unknown.
        f("pg_stat_get_numscans", any(), 1..=1, to_bigint, |_| {
            Ok(ScalarValue::Int64(None))
        }),
        // Nor standbys: a server is never in recovery.
        f(
            "pg_is_in_recovery",
            Signature::nullary(Volatility::Stable),
            0..=0,
            to_bool,
            |_| Ok(ScalarValue::Boolean(Some(false))),
        ),
        f(
            "pg_is_wal_replay_paused",
            Signature::nullary(Volatility::Stable),
            0..=0,
            to_bool,
            |_| Ok(ScalarValue::Boolean(Some(false))),
        ),
        // `bpchar(x)`, the cast to `character` written as a call (pgAdmin's templates).
        f("bpchar", any(), 1..=1, to_text, as_plain_text),
        f("pg_get_triggerdef", any(), 1..=2, to_text, |_| {
            Ok(text(None))
        }),
        // Weir keeps no per-relation size: unknown, as PostgreSQL's functions for a relation
        // they do not find.
        f("pg_table_size", any(), 1..=1, to_bigint, |_| {
            Ok(ScalarValue::Int64(None))
        }),
        f("pg_relation_size", any(), 1..=2, to_bigint, |_| {
            Ok(ScalarValue::Int64(None))
        }),
        f("pg_total_relation_size", any(), 1..=1, to_bigint, |_| {
            Ok(ScalarValue::Int64(None))
        }),
        f("pg_indexes_size", any(), 1..=1, to_bigint, |_| {
            Ok(ScalarValue::Int64(None))
        }),
        f("pg_size_pretty", any(), 1..=1, to_text, |v| {
            Ok(text(match v[0].cast_to(&DataType::Int64)? {
                ScalarValue::Int64(Some(n)) => Some(size_pretty(n)),
                _ => None,
            }))
        }),
        // Settings change with SET: a query cannot change its own session's yet.
        f(
            "set_config",
            Signature::variadic_any(Volatility::Volatile),
            3..=3,
            to_text,
            |_| {
                Err(external(
                    crate::error::ErrorKind::NotSupported,
                    "set_config is not supported: use SET (or SET LOCAL)",
                ))
            },
        ),
        f("pg_typeof", any(), 1..=1, to_text, |v| {
            Ok(text(Some(match v[0].data_type() {
                DataType::Null => "unknown".to_string(),
                t => crate::types::pg_type_of(&t).name.to_string(),
            })))
        }),
    ]
}

/// The session's own process id, and the signals that stop another session's statement or
/// end it. With no session (a context of no connection's), there is none to find or signal.
fn of_session(relations: &Arc<Relations>) -> Vec<CatalogFn> {
    let own = relations.backend.clone();
    let pid = own.as_ref().map(|b| b.start.pid);
    let signal = move |terminate: bool| {
        let own = own.clone();
        let relations = relations.clone();
        move |v: &[ScalarValue]| -> DfResult<ScalarValue> {
            if let Some(timeout) = v.get(1) {
                match timeout.cast_to(&DataType::Int64)? {
                    ScalarValue::Int64(Some(t)) if t < 0 => {
                        return Err(external(
                            crate::error::ErrorKind::NumericOutOfRange,
                            "\"timeout\" must not be negative",
                        ))
                    }
                    ScalarValue::Int64(Some(t)) if t > 0 => {
                        return Err(external(
                            crate::error::ErrorKind::NotSupported,
                            "pg_terminate_backend with a timeout is not supported",
                        ))
                    }
                    _ => {}
                }
            }
            let ScalarValue::Int64(Some(pid)) = v[0].cast_to(&DataType::Int64)? else {
                return Ok(ScalarValue::Boolean(None));
            };
            // PostgreSQL warns that a process id of no session is not a backend's.
            let Some(target) =
                (i32::try_from(pid).ok()).and_then(|pid| own.as_ref().and_then(|b| b.session(pid)))
            else {
                return Ok(ScalarValue::Boolean(Some(false)));
            };
            may_signal(&relations, &target.start.user, terminate)?;
            if terminate {
                target.terminate();
            } else {
                target.cancel();
            }
            Ok(ScalarValue::Boolean(Some(true)))
        }
    };
    let volatile = || Signature::variadic_any(Volatility::Volatile);
    vec![
        f(
            "pg_backend_pid",
            Signature::nullary(Volatility::Stable),
            0..=0,
            |_| DataType::Int32,
            move |_| Ok(ScalarValue::Int32(pid)),
        ),
        f(
            "pg_cancel_backend",
            volatile(),
            1..=1,
            to_bool,
            signal(false),
        ),
        f(
            "pg_terminate_backend",
            volatile(),
            1..=2,
            to_bool,
            signal(true),
        ),
    ]
}

/// Refuses (42501, in PostgreSQL's words) unless the query's session may signal a session
/// of the role named `user`: a superuser's only if it is one too, another's if it has that
/// role's privileges.
fn may_signal(relations: &Relations, user: &str, terminate: bool) -> DfResult<()> {
    let target = relations.roles.iter().find(|r| r.name == user);
    let superuser = relations.session_role().is_some_and(|r| r.superuser);
    let what = |cancel: &'static str, end: &'static str| if terminate { end } else { cancel };
    if target.is_some_and(|t| t.superuser) && !superuser && relations.backend.is_some() {
        let message = format!(
            "must be a superuser to {}",
            what("cancel superuser query", "terminate superuser process")
        );
        return Err(external(
            crate::error::ErrorKind::InsufficientPrivilege,
            &message,
        ));
    }
    if !relations.acts_for(user) {
        let message = format!(
            "must be a member of the role whose {} or member of pg_signal_backend",
            what("query is being canceled", "process is being terminated")
        );
        return Err(external(
            crate::error::ErrorKind::InsufficientPrivilege,
            &message,
        ));
    }
    Ok(())
}

pub(super) fn external(kind: crate::error::ErrorKind, message: &str) -> DataFusionError {
    DataFusionError::External(Box::new(crate::error::Error::new(kind, message)))
}

/// `json_build_object(k1, v1, ...)`'s text: keys as strings, values as JSON.
fn json_object(pairs: &[ScalarValue]) -> DfResult<String> {
    if !pairs.len().is_multiple_of(2) {
        return Err(DataFusionError::Plan(
            "argument list must have even number of elements".into(),
        ));
    }
    let quote = |s: &str| serde_json::Value::String(s.to_string()).to_string();
    let mut out = String::from("{");
    for (i, pair) in pairs.chunks(2).enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        let key = match &pair[0] {
            k if k.is_null() => {
                return Err(DataFusionError::Plan("argument 1 cannot be null".into()))
            }
            k => k.to_string(),
        };
        let value = match &pair[1] {
            v if v.is_null() => "null".to_string(),
            ScalarValue::Boolean(Some(b)) => b.to_string(),
            v if v.data_type().is_numeric() => v.to_string(),
            v => quote(&v.to_string()),
        };
        out.push_str(&format!("{} : {value}", quote(&key)));
    }
    out.push('}');
    Ok(out)
}

/// `pg_size_pretty(n)`: bytes below 10 kB, else the largest unit that keeps the number
/// below 20 480, rounded half away from zero, as PostgreSQL prints it.
fn size_pretty(bytes: i64) -> String {
    const LIMIT: i64 = 10 * 1024;
    if bytes.abs() < LIMIT {
        return format!("{bytes} bytes");
    }
    let half_rounded = |x: i64| (x + if x < 0 { -1 } else { 1 }) / 2;
    // One extra bit for rounding.
    let mut size = bytes >> 9;
    for unit in ["kB", "MB", "GB", "TB"] {
        if size.abs() < LIMIT * 2 - 1 {
            return format!("{} {unit}", half_rounded(size));
        }
        size >>= 10;
    }
    format!("{} PB", half_rounded(size))
}

/// A value's text, for a cast to `name`, `"char"` or `bpchar`.
fn as_plain_text(v: &[ScalarValue]) -> DfResult<ScalarValue> {
    Ok(text(match &v[0] {
        s if s.is_null() => None,
        s => Some(s.to_string()),
    }))
}

/// PostgreSQL's `json`, whose values travel as their text.
const JSON_OID: u32 = 114;

fn as_oid_signed(v: &ScalarValue) -> Option<i32> {
    match v.cast_to(&DataType::Int64).ok()? {
        ScalarValue::Int64(Some(v)) => i32::try_from(v).ok(),
        _ => None,
    }
}

fn visible(_: &[ScalarValue]) -> DfResult<ScalarValue> {
    Ok(ScalarValue::Boolean(Some(true)))
}

pub(super) fn f(
    name: &'static str,
    signature: Signature,
    arity: std::ops::RangeInclusive<usize>,
    returns: fn(&[DataType]) -> DataType,
    body: impl Fn(&[ScalarValue]) -> DfResult<ScalarValue> + Send + Sync + 'static,
) -> CatalogFn {
    CatalogFn {
        name,
        signature,
        arity,
        returns,
        declared: None,
        body: Arc::new(body),
    }
}

/// `weir_single(e)`: `e` of the one row it aggregates, NULL without rows, and PostgreSQL's
/// error for more than one (a correlated scalar subquery, `subquery::decorrelate`).
#[derive(Debug, PartialEq, Eq, Hash)]
struct Single {
    signature: Signature,
}

fn more_than_one_row() -> DataFusionError {
    DataFusionError::External(Box::new(crate::error::Error::new(
        crate::error::ErrorKind::CardinalityViolation,
        "more than one row returned by a subquery used as an expression",
    )))
}

impl AggregateUDFImpl for Single {
    fn name(&self) -> &str {
        super::subquery::SINGLE
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> DfResult<DataType> {
        Ok(args.first().cloned().unwrap_or(DataType::Null))
    }

    fn accumulator(&self, args: AccumulatorArgs) -> DfResult<Box<dyn Accumulator>> {
        Ok(Box::new(OneRow {
            value: ScalarValue::try_from(args.return_field.data_type())?,
            rows: 0,
        }))
    }

    fn state_fields(&self, args: StateFieldsArgs) -> DfResult<Vec<FieldRef>> {
        let value = args.return_field.as_ref().clone();
        Ok(vec![
            Arc::new(value.with_name(format_state_name(args.name, "value"))),
            Arc::new(Field::new(
                format_state_name(args.name, "rows"),
                DataType::UInt64,
                false,
            )),
        ])
    }
}

#[derive(Debug)]
struct OneRow {
    value: ScalarValue,
    rows: u64,
}

impl OneRow {
    fn add(&mut self, rows: u64, value: impl FnOnce() -> DfResult<ScalarValue>) -> DfResult<()> {
        if rows == 0 {
            return Ok(());
        }
        self.rows += rows;
        if self.rows > 1 {
            return Err(more_than_one_row());
        }
        self.value = value()?;
        Ok(())
    }
}

impl Accumulator for OneRow {
    fn update_batch(&mut self, values: &[ArrayRef]) -> DfResult<()> {
        let Some(values) = values.first() else {
            return Ok(());
        };
        self.add(values.len() as u64, || {
            ScalarValue::try_from_array(values, 0)
        })
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> DfResult<()> {
        let [values, rows] = states else {
            return Err(DataFusionError::Internal("weir_single's state".into()));
        };
        let rows = rows.as_primitive::<UInt64Type>();
        for i in 0..rows.len() {
            self.add(rows.value(i), || ScalarValue::try_from_array(values, i))?;
        }
        Ok(())
    }

    fn state(&mut self) -> DfResult<Vec<ScalarValue>> {
        Ok(vec![
            self.value.clone(),
            ScalarValue::UInt64(Some(self.rows)),
        ])
    }

    fn evaluate(&mut self) -> DfResult<ScalarValue> {
        Ok(self.value.clone())
    }

    fn size(&self) -> usize {
        std::mem::size_of_val(self) + self.value.size() - std::mem::size_of_val(&self.value)
    }
}
