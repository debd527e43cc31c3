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

/// Builds one table's rows.
pub type Build = fn(&Relations) -> Result<RecordBatch>;

/// One value of a row.
pub(super) enum V {
    O(u32),
    /// An array of numbers (`i2[]`, `oid[]`).
    L(Vec<i64>),
    T(String),
    B(bool),
    I(i64),
    N,
}

use V::{B, I, N, O};

pub(super) fn t(s: impl Into<String>) -> V {
    V::T(s.into())
}

/// A table from its columns (`name:type`, types `oid`, `text`, `bool`, `i2`, `i4`, `i8`, `f4`,
/// `timestamptz` (microseconds since the epoch), `text[]`, `oid[]`, `i2[]`) and rows.
pub(super) fn table(columns: &str, rows: Vec<Vec<V>>) -> Result<RecordBatch> {
    let columns: Vec<(&str, &str)> = (columns.split_whitespace())
        .map(|c| c.split_once(':').unwrap_or((c, "text")))
        .collect();
    let mut fields = Vec::with_capacity(columns.len());
    let mut arrays: Vec<ArrayRef> = Vec::with_capacity(columns.len());
    for (i, (name, ty)) in columns.iter().enumerate() {
        let cells = rows.iter().map(|r| r.get(i).unwrap_or(&N));
        let bad = || Error::internal(format!("catalog column {name}: a value of another type"));
        let array: ArrayRef = match *ty {
            "oid" => Arc::new(
                (cells.map(|c| match c {
                    O(v) => Ok(Some(*v)),
                    N => Ok(None),
                    _ => Err(bad()),
                }))
                .collect::<Result<UInt32Array>>()?,
            ),
            "text" => Arc::new(
                (cells.map(|c| match c {
                    V::T(v) => Ok(Some(v.as_str())),
                    N => Ok(None),
                    _ => Err(bad()),
                }))
                .collect::<Result<StringArray>>()?,
            ),
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
            "oid[]" | "i2[]" => {
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
                    "oid[]" => DataType::UInt32,
                    _ => DataType::Int16,
                };
                let to = DataType::List(Arc::new(Field::new("item", element, true)));
                datafusion::arrow::compute::cast(&b.finish(), &to)?
            }
            "text[]" => {
                // Text arrays the catalogs hold are NULL here (no ACLs, no options).
                let mut b = ListBuilder::new(StringBuilder::new());
                for _ in 0..rows.len() {
                    b.append_null();
                }
                Arc::new(b.finish())
            }
            other => return Err(Error::internal(format!("catalog column type {other}"))),
        };
        fields.push(Field::new(*name, array.data_type().clone(), true));
        arrays.push(array);
    }
    Ok(RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays)?)
}
