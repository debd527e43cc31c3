//! The catalog tables' row-to-batch builder: a table from its columns' names and types, as
//! PostgreSQL's catalogs declare them, and its rows of values.

use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, BooleanArray, Float32Array, Int16Array, Int32Array, Int64Array, Int64Builder,
    ListBuilder, RecordBatch, StringArray, StringBuilder, TimestampMicrosecondArray, UInt32Array,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema};

use super::Relations;
use crate::error::{Error, Result};
use crate::sql::names::{declared, CHAR_OID, NAME_OID};

/// The OID of a column type that Arrow's type does not tell: text that is `name`, `"char"`,
/// `varchar` or `pg_node_tree`, an OID that is an `xid`, an array that is an `int2vector` or
/// `oidvector`, and the types of values Weir never has (`NEVER_VALUED`).
fn declared_oid(ty: &str) -> Option<u32> {
    Some(match ty {
        "name" => NAME_OID,
        "char" => CHAR_OID,
        "varchar" => 1043,
        "pg_node_tree" => 194,
        "xid" => 28,
        "int2vector" => 22,
        "oidvector" => 30,
        "aclitem[]" => 1034,
        "char[]" => 1002,
        "anyarray" => 2277,
        "bytea" => 17,
        _ => return None,
    })
}

/// Column types whose values Weir never has (a trigger's arguments, an added column's
/// default): NULL in every row, so that the client is told PostgreSQL's type without Weir
/// having to send such a value.
const NEVER_VALUED: [&str; 3] = ["char[]", "anyarray", "bytea"];

/// Builds one table's rows.
pub type Build = fn(&Relations) -> Result<RecordBatch>;

/// One value of a row.
pub(super) enum V {
    O(u32),
    /// An array of numbers (`i2[]`, `oid[]`).
    L(Vec<i64>),
    /// A text array (`text[]`).
    S(Vec<String>),
    T(String),
    B(bool),
    I(i64),
    N,
}

use V::{B, I, N, O};

pub(super) fn t(s: impl Into<String>) -> V {
    V::T(s.into())
}

/// A table from its columns (`name:type`, types `oid`, `text`, `name`, `char`, `varchar`,
/// `pg_node_tree`, `bool`, `i2`, `i4`, `i8`, `f4`, `xid`, `timestamptz` (microseconds since the
/// epoch), `text[]`, `aclitem[]`, `oid[]`, `i2[]`, `int2vector`, `oidvector`, and
/// `NEVER_VALUED`'s) and rows. A field whose type Arrow's does not tell says which it is
/// (`declared_oid`), so that a client is told PostgreSQL's type.
pub(super) fn table(columns: &str, rows: Vec<Vec<V>>) -> Result<RecordBatch> {
    let columns: Vec<(&str, &str)> = (columns.split_whitespace())
        .map(|c| c.split_once(':').unwrap_or((c, "text")))
        .collect();
    let mut fields = Vec::with_capacity(columns.len());
    let mut arrays: Vec<ArrayRef> = Vec::with_capacity(columns.len());
    for (i, (name, ty)) in columns.iter().enumerate() {
        let cells = rows.iter().map(|r| r.get(i).unwrap_or(&N));
        let bad = || Error::internal(format!("catalog column {name}: a value of another type"));
        if NEVER_VALUED.contains(ty) && rows.iter().any(|r| !matches!(r.get(i), None | Some(N))) {
            return Err(bad());
        }
        let array: ArrayRef = match *ty {
            "oid" | "xid" => Arc::new(
                (cells.map(|c| match c {
                    O(v) => Ok(Some(*v)),
                    N => Ok(None),
                    _ => Err(bad()),
                }))
                .collect::<Result<UInt32Array>>()?,
            ),
            "text" | "name" | "char" | "varchar" | "pg_node_tree" | "anyarray" | "bytea" => {
                Arc::new(
                    (cells.map(|c| match c {
                        V::T(v) => Ok(Some(v.as_str())),
                        N => Ok(None),
                        _ => Err(bad()),
                    }))
                    .collect::<Result<StringArray>>()?,
                )
            }
            "bool" => Arc::new(
                (cells.map(|c| match c {
                    B(v) => Ok(Some(*v)),
                    N => Ok(None),
                    _ => Err(bad()),
                }))
                .collect::<Result<BooleanArray>>()?,
            ),
            "i2" | "i4" | "i8" | "f4" => {
                let ints: Vec<Option<i64>> = (cells.map(|c| match c {
                    I(v) => Ok(Some(*v)),
                    N => Ok(None),
                    _ => Err(bad()),
                }))
                .collect::<Result<_>>()?;
                match *ty {
                    "i2" => Arc::new(Int16Array::from_iter(
                        ints.iter().map(|v| v.map(|v| v as i16)),
                    )),
                    "i4" => Arc::new(Int32Array::from_iter(
                        ints.iter().map(|v| v.map(|v| v as i32)),
                    )),
                    "f4" => Arc::new(Float32Array::from_iter(
                        ints.iter().map(|v| v.map(|v| v as f32)),
                    )),
                    _ => Arc::new(Int64Array::from_iter(ints)),
                }
            }
            "timestamptz" => Arc::new(
                (cells.map(|c| match c {
                    I(v) => Ok(Some(*v)),
                    N => Ok(None),
                    _ => Err(bad()),
                }))
                .collect::<Result<TimestampMicrosecondArray>>()?
                .with_timezone("+00:00"),
            ),
            "oid[]" | "i2[]" | "int2vector" | "oidvector" => {
                let mut b = ListBuilder::new(Int64Builder::new());
                for cell in cells {
                    match cell {
                        V::L(values) => {
                            b.values().append_slice(values);
                            b.append(true);
                        }
                        N => b.append_null(),
                        _ => return Err(bad()),
                    }
                }
                let element = match *ty {
                    "oid[]" | "oidvector" => DataType::UInt32,
                    _ => DataType::Int16,
                };
                let to = DataType::List(Arc::new(Field::new("item", element, true)));
                datafusion::arrow::compute::cast(&b.finish(), &to)?
            }
            "text[]" | "aclitem[]" | "char[]" => {
                // A role's settings, and ACLs in `aclitem`'s text form.
                let mut b = ListBuilder::new(StringBuilder::new());
                for cell in cells {
                    match cell {
                        V::S(values) => {
                            for v in values {
                                b.values().append_value(v);
                            }
                            b.append(true);
                        }
                        N => b.append_null(),
                        _ => return Err(bad()),
                    }
                }
                Arc::new(b.finish())
            }
            other => return Err(Error::internal(format!("catalog column type {other}"))),
        };
        let field = Field::new(*name, array.data_type().clone(), true);
        fields.push(match declared_oid(ty) {
            Some(oid) => declared(field, oid),
            None => field,
        });
        arrays.push(array);
    }
    Ok(RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays)?)
}
