//! SQL types as PostgreSQL names them, and how each maps to an Arrow type and a built-in OID.
//!
//! Table columns are declared with a `SqlType`; everything computed (view columns, query
//! results) is typed by DataFusion in Arrow terms, and `pg_type_of` maps those back to the
//! PostgreSQL type a client sees.

use std::fmt;

use datafusion::arrow::datatypes::{DataType, IntervalUnit, TimeUnit};
use datafusion::sql::sqlparser::ast::{self, ExactNumberInfo};
use serde::{Deserialize, Serialize};

use crate::error::{Error, ErrorKind, Result};

/// The time zone in which `timestamptz` values are stored and shown.
pub const TIMESTAMPTZ_ZONE: &str = "+00:00";

/// Largest precision of a `numeric` column: Arrow's Decimal128 holds 38 digits.
pub const NUMERIC_PRECISION_MAX: u8 = 38;

/// Scale given to `numeric` declared without precision and scale (PostgreSQL's unconstrained
/// numeric has no fixed scale; Weir stores such columns as numeric(38,10)).
pub const NUMERIC_DEFAULT_SCALE: i8 = 10;

/// A column type that a table can declare.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SqlType {
    Boolean,
    SmallInt,
    Integer,
    BigInt,
    Real,
    Double,
    Numeric { precision: u8, scale: i8 },
    Text,
    Varchar { max_chars: Option<u32> },
    Date,
    Timestamp,
    Timestamptz,
    Interval,
}

impl SqlType {
    pub fn to_arrow(self) -> DataType {
        match self {
            SqlType::Boolean => DataType::Boolean,
            SqlType::SmallInt => DataType::Int16,
            SqlType::Integer => DataType::Int32,
            SqlType::BigInt => DataType::Int64,
            SqlType::Real => DataType::Float32,
            SqlType::Double => DataType::Float64,
            SqlType::Numeric { precision, scale } => DataType::Decimal128(precision, scale),
            SqlType::Text | SqlType::Varchar { .. } => DataType::Utf8,
            SqlType::Date => DataType::Date32,
            SqlType::Timestamp => DataType::Timestamp(TimeUnit::Microsecond, None),
            SqlType::Timestamptz => {
                DataType::Timestamp(TimeUnit::Microsecond, Some(TIMESTAMPTZ_ZONE.into()))
            }
            SqlType::Interval => DataType::Interval(IntervalUnit::MonthDayNano),
        }
    }

    /// Reads a type from a `CREATE TABLE` column definition.
    pub fn from_ast(t: &ast::DataType) -> Result<SqlType> {
        use ast::DataType as T;
        let unsupported = || {
            Error::not_supported(format!("type {t} is not supported"))
                .with_hint("Supported types: boolean, smallint, integer, bigint, real, double precision, numeric(p,s), text, varchar(n), date, timestamp, timestamptz, interval.")
        };
        Ok(match t {
            T::Bool | T::Boolean => SqlType::Boolean,
            T::SmallInt(_) | T::Int2(_) => SqlType::SmallInt,
            T::Int(_) | T::Integer(_) | T::Int4(_) => SqlType::Integer,
            T::BigInt(_) | T::Int8(_) => SqlType::BigInt,
            T::Real | T::Float4 => SqlType::Real,
            T::Double(_) | T::DoublePrecision | T::Float8 => SqlType::Double,
            T::Float(info) => match info {
                ExactNumberInfo::Precision(p) if *p <= 24 => SqlType::Real,
                _ => SqlType::Double,
            },
            T::Numeric(info) | T::Decimal(info) | T::Dec(info) => numeric_type(info)?,
            T::Text | T::String(_) => SqlType::Text,
            T::Varchar(len) | T::CharacterVarying(len) | T::CharVarying(len) => SqlType::Varchar {
                max_chars: char_length(len.as_ref())?,
            },
            T::Date => SqlType::Date,
            T::Timestamp(_, tz) => match tz {
                ast::TimezoneInfo::None | ast::TimezoneInfo::WithoutTimeZone => SqlType::Timestamp,
                ast::TimezoneInfo::WithTimeZone | ast::TimezoneInfo::Tz => SqlType::Timestamptz,
            },
            T::TimestampNtz(_) => SqlType::Timestamp,
            T::Interval { .. } => SqlType::Interval,
            T::Custom(name, modifiers) if modifiers.is_empty() => {
                match name.to_string().to_lowercase().as_str() {
                    "timestamptz" => SqlType::Timestamptz,
                    "int2" => SqlType::SmallInt,
                    "int4" => SqlType::Integer,
                    "int8" => SqlType::BigInt,
                    "float4" => SqlType::Real,
                    "float8" => SqlType::Double,
                    "bool" => SqlType::Boolean,
                    _ => return Err(unsupported()),
                }
            }
            _ => return Err(unsupported()),
        })
    }

    /// The OID of the built-in PostgreSQL type.
    pub fn pg_oid(self) -> u32 {
        match self {
            SqlType::Varchar { .. } => 1043,
            other => pg_type_of(&other.to_arrow()).oid,
        }
    }
}

fn numeric_type(info: &ExactNumberInfo) -> Result<SqlType> {
    let (precision, scale) = match info {
        ExactNumberInfo::None => (NUMERIC_PRECISION_MAX as u64, NUMERIC_DEFAULT_SCALE as i64),
        ExactNumberInfo::Precision(p) => (*p, 0),
        ExactNumberInfo::PrecisionAndScale(p, s) => (*p, *s),
    };
    if precision == 0 || precision > NUMERIC_PRECISION_MAX as u64 {
        return Err(Error::new(
            ErrorKind::InvalidParameter,
            format!("NUMERIC precision {precision} must be between 1 and {NUMERIC_PRECISION_MAX}"),
        ));
    }
    if scale < 0 || scale as u64 > precision {
        return Err(Error::new(
            ErrorKind::InvalidParameter,
            format!("NUMERIC scale {scale} must be between 0 and precision {precision}"),
        ));
    }
    Ok(SqlType::Numeric {
        precision: precision as u8,
        scale: scale as i8,
    })
}

fn char_length(len: Option<&ast::CharacterLength>) -> Result<Option<u32>> {
    match len {
        None | Some(ast::CharacterLength::Max) => Ok(None),
        Some(ast::CharacterLength::IntegerLength { length, .. }) => {
            if *length == 0 || *length > 10_485_760 {
                return Err(Error::new(
                    ErrorKind::InvalidParameter,
                    format!("length for type varchar must be between 1 and 10485760, not {length}"),
                ));
            }
            Ok(Some(*length as u32))
        }
    }
}

impl fmt::Display for SqlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SqlType::Boolean => f.write_str("boolean"),
            SqlType::SmallInt => f.write_str("smallint"),
            SqlType::Integer => f.write_str("integer"),
            SqlType::BigInt => f.write_str("bigint"),
            SqlType::Real => f.write_str("real"),
            SqlType::Double => f.write_str("double precision"),
            SqlType::Numeric { precision, scale } => write!(f, "numeric({precision},{scale})"),
            SqlType::Text => f.write_str("text"),
            SqlType::Varchar { max_chars: None } => f.write_str("character varying"),
            SqlType::Varchar { max_chars: Some(n) } => write!(f, "character varying({n})"),
            SqlType::Date => f.write_str("date"),
            SqlType::Timestamp => f.write_str("timestamp without time zone"),
            SqlType::Timestamptz => f.write_str("timestamp with time zone"),
            SqlType::Interval => f.write_str("interval"),
        }
    }
}

/// A PostgreSQL type as a client sees it in a RowDescription.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PgType {
    pub oid: u32,
    pub name: &'static str,
}

/// The array type of a built-in element type, by OID.
fn array_of(element: u32) -> Option<(u32, &'static str)> {
    Some(match element {
        16 => (1000, "boolean[]"),
        17 => (1001, "bytea[]"),
        20 => (1016, "bigint[]"),
        21 => (1005, "smallint[]"),
        23 => (1007, "integer[]"),
        25 => (1009, "text[]"),
        26 => (1028, "oid[]"),
        700 => (1021, "real[]"),
        701 => (1022, "double precision[]"),
        1082 => (1182, "date[]"),
        1083 => (1183, "time without time zone[]"),
        1114 => (1115, "timestamp without time zone[]"),
        1184 => (1185, "timestamp with time zone[]"),
        1186 => (1187, "interval[]"),
        1700 => (1231, "numeric[]"),
        _ => return None,
    })
}

/// The built-in PostgreSQL type a value of this Arrow type is sent as. Only built-in OIDs go
/// on the wire: types without a faithful PostgreSQL twin are sent as text.
pub fn pg_type_of(t: &DataType) -> PgType {
    let (oid, name) = match t {
        DataType::Boolean => (16, "boolean"),
        DataType::Int8 | DataType::Int16 | DataType::UInt8 => (21, "smallint"),
        DataType::Int32 | DataType::UInt16 => (23, "integer"),
        DataType::Int64 => (20, "bigint"),
        // PostgreSQL's oid: an unsigned 32-bit integer (the catalogs' OID columns).
        DataType::UInt32 => (26, "oid"),
        DataType::UInt64 => (1700, "numeric"),
        DataType::Float16 | DataType::Float32 => (700, "real"),
        DataType::Float64 => (701, "double precision"),
        DataType::Decimal32(..)
        | DataType::Decimal64(..)
        | DataType::Decimal128(..)
        | DataType::Decimal256(..) => (1700, "numeric"),
        DataType::Date32 | DataType::Date64 => (1082, "date"),
        DataType::Timestamp(_, None) => (1114, "timestamp without time zone"),
        DataType::Timestamp(_, Some(_)) => (1184, "timestamp with time zone"),
        DataType::Interval(_) | DataType::Duration(_) => (1186, "interval"),
        DataType::Time32(_) | DataType::Time64(_) => (1083, "time without time zone"),
        DataType::Binary
        | DataType::LargeBinary
        | DataType::BinaryView
        | DataType::FixedSizeBinary(_) => (17, "bytea"),
        DataType::Dictionary(_, v) => return pg_type_of(v),
        DataType::List(element) | DataType::LargeList(element) => {
            array_of(pg_type_of(element.data_type()).oid).unwrap_or((25, "text"))
        }
        _ => (25, "text"),
    };
    PgType { oid, name }
}

#[cfg(test)]
mod tests {
    #[test]
    fn dates_drop_a_time_or_zone_after_them() {
        use super::normalize_date_text as d;
        assert_eq!(d("2024-03-01 +00").as_deref(), Some("2024-03-01"));
        assert_eq!(d("2024-03-01 12:30:00.5-07").as_deref(), Some("2024-03-01"));
        assert_eq!(d("2024-03-01 UTC").as_deref(), Some("2024-03-01"));
        assert_eq!(d("2024-03-01"), None);
        assert_eq!(d("2024-03-01 garbage"), None);
    }

    use super::*;
    use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
    use datafusion::sql::sqlparser::parser::Parser;

    fn parse_type(s: &str) -> Result<SqlType> {
        let sql = format!("CREATE TABLE t (c {s})");
        let stmt = Parser::parse_sql(&PostgreSqlDialect {}, &sql)
            .unwrap()
            .remove(0);
        match stmt {
            ast::Statement::CreateTable(ct) => SqlType::from_ast(&ct.columns[0].data_type),
            _ => unreachable!(),
        }
    }

    #[test]
    fn declared_types_map_to_postgres_names() {
        for (decl, shown) in [
            ("int", "integer"),
            ("int8", "bigint"),
            ("smallint", "smallint"),
            ("real", "real"),
            ("double precision", "double precision"),
            ("numeric(10,2)", "numeric(10,2)"),
            ("decimal(5)", "numeric(5,0)"),
            ("varchar(20)", "character varying(20)"),
            ("text", "text"),
            ("timestamptz", "timestamp with time zone"),
            ("timestamp", "timestamp without time zone"),
            ("date", "date"),
            ("interval", "interval"),
            ("boolean", "boolean"),
        ] {
            assert_eq!(parse_type(decl).unwrap().to_string(), shown, "{decl}");
        }
    }

    #[test]
    fn out_of_range_numeric_is_refused() {
        assert_eq!(
            parse_type("numeric(50,2)").unwrap_err().kind,
            ErrorKind::InvalidParameter
        );
        assert_eq!(
            parse_type("numeric(5,7)").unwrap_err().kind,
            ErrorKind::InvalidParameter
        );
        assert_eq!(
            parse_type("json").unwrap_err().kind,
            ErrorKind::NotSupported
        );
    }
}

/// Date text as PostgreSQL reads it where the date is followed by a time or a time zone,
/// which a date ignores (`2024-03-01 +00`, as pgJDBC's `setDate` sends it;
/// `2024-03-01 12:00:00`): the date alone. `None` when there is nothing to drop, or the rest
/// is not a time or zone (the cast then reports the text).
pub fn normalize_date_text(text: &str) -> Option<String> {
    let text = text.trim();
    let (date, rest) = text.split_once(char::is_whitespace)?;
    let time_or_zone = rest.split_whitespace().all(|part| {
        part.eq_ignore_ascii_case("utc")
            || part.eq_ignore_ascii_case("z")
            || part
                .chars()
                .all(|c| c.is_ascii_digit() || matches!(c, ':' | '.' | '+' | '-'))
    });
    time_or_zone.then(|| date.to_string())
}

/// Rewrites PostgreSQL interval text into the form Arrow reads: clock notation
/// (`[-]H:MM[:SS[.f]]`) becomes hours, minutes and seconds, and `mon`/`mons` become months.
/// Returns `None` when the text needs no rewrite (or is not an interval Weir understands, which
/// the cast then reports).
pub fn normalize_interval_text(text: &str) -> Option<String> {
    let mut changed = false;
    let mut out: Vec<String> = Vec::new();
    for token in text.split_whitespace() {
        let lower = token.to_lowercase();
        if let Some(clock) = clock_time(token) {
            out.push(clock);
            changed = true;
        } else if lower == "mon" || lower == "mons" {
            out.push("months".into());
            changed = true;
        } else {
            out.push(token.to_string());
        }
    }
    changed.then(|| out.join(" "))
}

/// `[-]H:MM[:SS[.f]]` as `H hours M minutes S seconds`, each carrying the sign.
fn clock_time(token: &str) -> Option<String> {
    let (sign, rest) = match token.strip_prefix('-') {
        Some(r) => ("-", r),
        None => ("", token.strip_prefix('+').unwrap_or(token)),
    };
    let parts: Vec<&str> = rest.split(':').collect();
    if !(2..=3).contains(&parts.len()) {
        return None;
    }
    let digits = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_digit());
    let seconds_ok = |s: &str| match s.split_once('.') {
        Some((whole, frac)) => digits(whole) && digits(frac),
        None => digits(s),
    };
    if !digits(parts[0]) || !digits(parts[1]) || (parts.len() == 3 && !seconds_ok(parts[2])) {
        return None;
    }
    let seconds = parts.get(2).copied().unwrap_or("0");
    Some(format!(
        "{sign}{} hours {sign}{} minutes {sign}{seconds} seconds",
        parts[0], parts[1]
    ))
}

#[cfg(test)]
mod interval_tests {
    use super::normalize_interval_text as n;

    #[test]
    fn postgres_interval_text_is_rewritten() {
        assert_eq!(
            n("04:05:06").as_deref(),
            Some("04 hours 05 minutes 06 seconds")
        );
        assert_eq!(
            n("1 year 2 mons 3 days -04:05:06.5").as_deref(),
            Some("1 year 2 months 3 days -04 hours -05 minutes -06.5 seconds")
        );
        assert_eq!(
            n("1 day 02:00").as_deref(),
            Some("1 day 02 hours 00 minutes 0 seconds")
        );
        assert_eq!(n("3 days"), None);
        assert_eq!(n("1:2:3:4"), None);
    }
}
