//! PostgreSQL's types as Weir's: which upstream type a declared column may read, and the text
//! of upstream values (the replication stream's and the snapshot's, PostgreSQL's output
//! functions with `DateStyle = ISO` and `TimeZone = UTC`) into Arrow arrays.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, BooleanArray, StringArray};
use datafusion::arrow::compute::{cast_with_options, CastOptions};
use datafusion::arrow::datatypes::DataType;

use crate::error::{Error, ErrorKind, Result};
use crate::types::SqlType;

/// A few of PostgreSQL's type OIDs (`pg_type.oid`, fixed for built-in types).
pub mod oid {
    pub const BOOL: u32 = 16;
    pub const NAME: u32 = 19;
    pub const INT8: u32 = 20;
    pub const INT2: u32 = 21;
    pub const INT4: u32 = 23;
    pub const TEXT: u32 = 25;
    pub const JSON: u32 = 114;
    pub const FLOAT4: u32 = 700;
    pub const FLOAT8: u32 = 701;
    pub const BPCHAR: u32 = 1042;
    pub const VARCHAR: u32 = 1043;
    pub const DATE: u32 = 1082;
    pub const TIMESTAMP: u32 = 1114;
    pub const TIMESTAMPTZ: u32 = 1184;
    pub const NUMERIC: u32 = 1700;
    pub const UUID: u32 = 2950;
    pub const JSONB: u32 = 3802;
}

/// Whether a column declared `declared` may read the upstream's column of type `type_oid`
/// (with its type modifier): the same type, or text for a type Weir keeps as text (json,
/// jsonb, uuid, character types).
pub fn reads(declared: SqlType, type_oid: u32, type_modifier: i32) -> bool {
    use oid::*;
    match declared {
        SqlType::Boolean => type_oid == BOOL,
        SqlType::SmallInt => type_oid == INT2,
        SqlType::Integer => type_oid == INT4,
        SqlType::BigInt => type_oid == INT8,
        SqlType::Real => type_oid == FLOAT4,
        SqlType::Double => type_oid == FLOAT8,
        SqlType::Numeric { precision, scale } => {
            // numeric(p, s) is ((p << 16) | s) + 4; -1 is numeric without a precision, whose
            // values need not fit the declared one.
            type_oid == NUMERIC
                && type_modifier >= 4
                && ((type_modifier - 4) >> 16) == i32::from(precision)
                && ((type_modifier - 4) & 0xFFFF) == i32::from(scale)
        }
        SqlType::Text | SqlType::Varchar { .. } => {
            matches!(
                type_oid,
                TEXT | VARCHAR | BPCHAR | NAME | JSON | JSONB | UUID
            )
        }
        SqlType::Date => type_oid == DATE,
        SqlType::Timestamp => type_oid == TIMESTAMP,
        SqlType::Timestamptz => type_oid == TIMESTAMPTZ,
        SqlType::Interval => false,
    }
}

/// A column of values in PostgreSQL's text form as an array of `ty`.
pub fn column(values: &[Option<&str>], ty: &DataType) -> Result<ArrayRef> {
    let bad = |v: &str| {
        Error::new(
            ErrorKind::InvalidText,
            format!("an upstream value \"{v}\" does not read as {ty}"),
        )
    };
    match ty {
        DataType::Utf8 => Ok(Arc::new(values.iter().copied().collect::<StringArray>())),
        DataType::Boolean => Ok(Arc::new(
            values
                .iter()
                .map(|v| match v {
                    None => Ok(None),
                    Some("t") => Ok(Some(true)),
                    Some("f") => Ok(Some(false)),
                    Some(other) => Err(bad(other)),
                })
                .collect::<Result<BooleanArray>>()?,
        )),
        DataType::Timestamp(_, Some(_)) => {
            // PostgreSQL writes a zone as `+00`; Arrow reads `+00:00`.
            let fixed: Vec<Option<String>> = values.iter().map(|v| v.map(full_offset)).collect();
            let text = fixed.iter().map(Option::as_deref).collect::<StringArray>();
            strict_cast(&text, ty, values)
        }
        _ => {
            let text = values.iter().copied().collect::<StringArray>();
            strict_cast(&text, ty, values)
        }
    }
}

/// `...+00` as `...+00:00` (a zone offset of whole hours, as PostgreSQL prints it).
fn full_offset(v: &str) -> String {
    let b = v.as_bytes();
    let n = b.len();
    if n >= 3 && (b[n - 3] == b'+' || b[n - 3] == b'-') && b[n - 2..].iter().all(u8::is_ascii_digit)
    {
        format!("{v}:00")
    } else {
        v.to_string()
    }
}

/// Casts text to `ty`, failing on a value that does not read (rather than making it NULL).
fn strict_cast(text: &StringArray, ty: &DataType, values: &[Option<&str>]) -> Result<ArrayRef> {
    let options = CastOptions {
        safe: false,
        ..Default::default()
    };
    cast_with_options(text, ty, &options).map_err(|e| {
        let first = values.iter().flatten().next().copied().unwrap_or_default();
        Error::new(
            ErrorKind::InvalidText,
            format!("upstream values do not read as {ty} (\"{first}\" ...): {e}"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Array, AsArray};
    use datafusion::arrow::datatypes::{Decimal128Type, TimestampMicrosecondType};

    #[test]
    fn declared_columns_read_their_upstream_types() {
        let numeric = |p: u8, s: i8| SqlType::Numeric {
            precision: p,
            scale: s,
        };
        assert!(reads(numeric(10, 2), oid::NUMERIC, ((10 << 16) | 2) + 4));
        assert!(!reads(numeric(10, 2), oid::NUMERIC, ((12 << 16) | 2) + 4));
        assert!(!reads(numeric(10, 2), oid::NUMERIC, -1));
        assert!(reads(SqlType::Text, oid::JSONB, -1));
        assert!(!reads(SqlType::Integer, oid::INT8, -1));
        assert!(!reads(SqlType::Timestamp, oid::TIMESTAMPTZ, -1));
    }

    #[test]
    fn postgresql_text_reads_as_arrow_values() {
        let ts = column(
            &[Some("2024-01-02 03:04:05.123456+00"), None],
            &SqlType::Timestamptz.to_arrow(),
        )
        .unwrap();
        let ts = ts.as_primitive::<TimestampMicrosecondType>();
        assert_eq!(ts.value(0), 1_704_164_645_123_456);
        assert!(ts.is_null(1));
        let n = column(
            &[Some("12.50"), Some("-0.01")],
            &SqlType::Numeric {
                precision: 10,
                scale: 2,
            }
            .to_arrow(),
        )
        .unwrap();
        assert_eq!(n.as_primitive::<Decimal128Type>().values(), &[1250, -1]);
        let b = column(&[Some("t"), Some("f")], &DataType::Boolean).unwrap();
        assert_eq!(
            b.as_boolean().iter().collect::<Vec<_>>(),
            [Some(true), Some(false)]
        );
        assert!(column(&[Some("yes")], &DataType::Boolean).is_err());
        assert!(column(&[Some("x")], &DataType::Int32).is_err());
        let d = column(&[Some("2024-02-29")], &SqlType::Date.to_arrow()).unwrap();
        assert_eq!(d.len(), 1);
    }
}
