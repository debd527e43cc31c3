//! Rows built a row at a time into one Arrow batch: the `weir_catalog` system tables and the
//! `SHOW` statements' rows, in the SQL types they are shown in.

use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, BooleanArray, Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};

use crate::error::{Error, Result};

/// The type of a system table's column.
#[derive(Clone, Copy)]
pub enum Type {
    Int,
    Text,
    Bool,
    /// A `timestamptz`, from milliseconds since the Unix epoch.
    Time,
}

/// One value of a row.
pub enum Cell {
    Int(Option<i64>),
    Text(Option<String>),
    Bool(bool),
    Time(i64),
}

impl From<i64> for Cell {
    fn from(v: i64) -> Cell {
        Cell::Int(Some(v))
    }
}

impl From<u64> for Cell {
    fn from(v: u64) -> Cell {
        Cell::Int(Some(v as i64))
    }
}

impl From<Option<u64>> for Cell {
    fn from(v: Option<u64>) -> Cell {
        Cell::Int(v.map(|v| v as i64))
    }
}

impl From<String> for Cell {
    fn from(v: String) -> Cell {
        Cell::Text(Some(v))
    }
}

impl From<&str> for Cell {
    fn from(v: &str) -> Cell {
        Cell::Text(Some(v.to_string()))
    }
}

impl From<Option<String>> for Cell {
    fn from(v: Option<String>) -> Cell {
        Cell::Text(v)
    }
}

impl From<Option<&str>> for Cell {
    fn from(v: Option<&str>) -> Cell {
        Cell::Text(v.map(str::to_string))
    }
}

impl From<bool> for Cell {
    fn from(v: bool) -> Cell {
        Cell::Bool(v)
    }
}

/// A system table's rows, built a row at a time. Columns are nullable where `?` ends their
/// name (`"epoch?"`).
pub struct Rows {
    columns: Vec<(&'static str, Type, bool)>,
    rows: Vec<Vec<Cell>>,
}

impl Rows {
    pub fn new(columns: &[(&'static str, Type)]) -> Rows {
        let columns = columns
            .iter()
            .map(|(name, ty)| match name.strip_suffix('?') {
                Some(name) => (name, *ty, true),
                None => (*name, *ty, false),
            })
            .collect();
        Rows {
            columns,
            rows: Vec::new(),
        }
    }

    pub fn push(&mut self, row: Vec<Cell>) {
        debug_assert_eq!(row.len(), self.columns.len());
        self.rows.push(row);
    }

    pub fn batch(self) -> Result<RecordBatch> {
        let fields: Vec<Field> = self
            .columns
            .iter()
            .map(|(name, ty, nullable)| {
                let ty = match ty {
                    Type::Int => DataType::Int64,
                    Type::Text => DataType::Utf8,
                    Type::Bool => DataType::Boolean,
                    Type::Time => DataType::Timestamp(
                        TimeUnit::Microsecond,
                        Some(crate::types::TIMESTAMPTZ_ZONE.into()),
                    ),
                };
                Field::new(*name, ty, *nullable)
            })
            .collect();
        let mut arrays: Vec<ArrayRef> = Vec::with_capacity(fields.len());
        for (i, (name, ty, _)) in self.columns.iter().enumerate() {
            let cells = self.rows.iter().map(|r| &r[i]);
            let mismatch = || Error::internal(format!("system table column {name}: wrong cell"));
            let array: ArrayRef = match ty {
                Type::Int => Arc::new(
                    cells
                        .map(|c| match c {
                            Cell::Int(v) => Ok(*v),
                            _ => Err(mismatch()),
                        })
                        .collect::<Result<Int64Array>>()?,
                ),
                Type::Text => Arc::new(
                    cells
                        .map(|c| match c {
                            Cell::Text(v) => Ok(v.as_deref()),
                            _ => Err(mismatch()),
                        })
                        .collect::<Result<StringArray>>()?,
                ),
                Type::Bool => Arc::new(
                    cells
                        .map(|c| match c {
                            Cell::Bool(v) => Ok(Some(*v)),
                            _ => Err(mismatch()),
                        })
                        .collect::<Result<BooleanArray>>()?,
                ),
                Type::Time => Arc::new(
                    cells
                        .map(|c| match c {
                            Cell::Time(ms) => Ok(Some(ms * 1000)),
                            _ => Err(mismatch()),
                        })
                        .collect::<Result<TimestampMicrosecondArray>>()?
                        .with_timezone(crate::types::TIMESTAMPTZ_ZONE),
                ),
            };
            arrays.push(array);
        }
        Ok(RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays)?)
    }
}
