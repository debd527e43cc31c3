//! Values on the wire: Arrow values to PostgreSQL's text and binary formats, and parameters
//! from either format to Arrow scalars.

use bytes::BytesMut;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Date32Array, Decimal128Array, Float32Array,
    Float64Array, Int16Array, Int32Array, Int64Array, Int8Array, IntervalMonthDayNanoArray,
    UInt16Array, UInt32Array, UInt64Array, UInt8Array,
};
use datafusion::arrow::datatypes::{
    DataType, Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, Int8Type,
    IntervalMonthDayNano, TimeUnit, TimestampMicrosecondType, TimestampMillisecondType,
    TimestampNanosecondType, TimestampSecondType, UInt16Type, UInt32Type, UInt64Type, UInt8Type,
};
use datafusion::arrow::util::display::array_value_to_string;
use datafusion::common::ScalarValue;
use pgwire::messages::data::DataRow;

use crate::error::{Error, ErrorKind, Result};
use crate::types::pg_type_of;

/// Days from 1970-01-01 (Arrow's epoch) to 2000-01-01 (PostgreSQL's).
const PG_EPOCH_DAYS: i64 = 10_957;
const PG_EPOCH_MICROS: i64 = PG_EPOCH_DAYS * 86_400_000_000;

/// Appends one value as PostgreSQL text; returns false for NULL (nothing appended).
pub fn text_value(array: &ArrayRef, row: usize, out: &mut Vec<u8>) -> Result<bool> {
    if array.is_null(row) {
        return Ok(false);
    }
    use std::io::Write;
    macro_rules! prim {
        ($t:ty) => {{
            let a = array.as_any().downcast_ref::<$t>().expect("type checked");
            let _ = write!(out, "{}", a.value(row));
        }};
    }
    match array.data_type() {
        DataType::Boolean => {
            let a = array.as_any().downcast_ref::<BooleanArray>().expect("bool");
            out.push(if a.value(row) { b't' } else { b'f' });
        }
        DataType::Int8 => prim!(Int8Array),
        DataType::Int16 => prim!(Int16Array),
        DataType::Int32 => prim!(Int32Array),
        DataType::Int64 => prim!(Int64Array),
        DataType::UInt8 => prim!(UInt8Array),
        DataType::UInt16 => prim!(UInt16Array),
        DataType::UInt32 => prim!(UInt32Array),
        DataType::UInt64 => prim!(UInt64Array),
        DataType::Float32 => {
            let v = array
                .as_any()
                .downcast_ref::<Float32Array>()
                .expect("f32")
                .value(row);
            out.extend_from_slice(float_text(v as f64, FloatWidth::Single).as_bytes());
        }
        DataType::Float64 => {
            let v = array
                .as_any()
                .downcast_ref::<Float64Array>()
                .expect("f64")
                .value(row);
            out.extend_from_slice(float_text(v, FloatWidth::Double).as_bytes());
        }
        DataType::Utf8 => out.extend_from_slice(array.as_string::<i32>().value(row).as_bytes()),
        DataType::LargeUtf8 => {
            out.extend_from_slice(array.as_string::<i64>().value(row).as_bytes())
        }
        DataType::Utf8View => out.extend_from_slice(array.as_string_view().value(row).as_bytes()),
        DataType::Decimal128(..) => {
            out.extend_from_slice(array_value_to_string(array, row)?.as_bytes());
        }
        DataType::Date32 => {
            out.extend_from_slice(array_value_to_string(array, row)?.as_bytes());
        }
        DataType::Timestamp(unit, tz) => {
            let micros = timestamp_micros(array, row, *unit);
            out.extend_from_slice(timestamp_text(micros, tz.is_some()).as_bytes());
        }
        DataType::Interval(_) => {
            let v = interval_value(array, row)?;
            out.extend_from_slice(interval_text(v).as_bytes());
        }
        DataType::List(_) => array_text(&array.as_list::<i32>().value(row), out)?,
        DataType::LargeList(_) => array_text(&array.as_list::<i64>().value(row), out)?,
        _ => out.extend_from_slice(array_value_to_string(array, row)?.as_bytes()),
    }
    Ok(true)
}

/// An array value as PostgreSQL's text: `{1,2,NULL}`, `{a,"b c",""}`. An element is quoted
/// when it is empty, reads as NULL, or holds a space, a comma, a brace, a quote or a
/// backslash (the last two escaped).
fn array_text(elements: &ArrayRef, out: &mut Vec<u8>) -> Result<()> {
    out.push(b'{');
    let mut element = Vec::new();
    for i in 0..elements.len() {
        if i > 0 {
            out.push(b',');
        }
        element.clear();
        if !text_value(elements, i, &mut element)? {
            out.extend_from_slice(b"NULL");
            continue;
        }
        let nested = matches!(
            elements.data_type(),
            DataType::List(_) | DataType::LargeList(_)
        );
        let special = |b: &u8| b" ,{}\"\\\t\n\r".contains(b);
        let quoted = !nested
            && (element.is_empty()
                || element.eq_ignore_ascii_case(b"null")
                || element.iter().any(special));
        if !quoted {
            out.extend_from_slice(&element);
            continue;
        }
        out.push(b'"');
        for &b in &element {
            if b == b'"' || b == b'\\' {
                out.push(b'\\');
            }
            out.push(b);
        }
        out.push(b'"');
    }
    out.push(b'}');
    Ok(())
}

/// A list of numbers as an `int2vector`'s or `oidvector`'s text: `1 2`; false for NULL.
fn vector_text(array: &ArrayRef, row: usize, out: &mut Vec<u8>) -> Result<bool> {
    if array.is_null(row) {
        return Ok(false);
    }
    let elements = match array.data_type() {
        DataType::List(_) => array.as_list::<i32>().value(row),
        _ => return text_value(array, row, out),
    };
    for i in 0..elements.len() {
        if i > 0 {
            out.push(b' ');
        }
        text_value(&elements, i, out)?;
    }
    Ok(true)
}

/// An array value in PostgreSQL's binary format: dimensions (0 for an empty array, else 1),
/// whether any element is NULL, the element type's OID, the length and lower bound (1), then
/// each element's length (-1 for NULL) and binary form.
fn array_binary(elements: &ArrayRef, out: &mut Vec<u8>) -> Result<()> {
    let too_long = || Error::new(ErrorKind::ProgramLimitExceeded, "array value too long");
    let length = i32::try_from(elements.len()).map_err(|_| too_long())?;
    let dimensions: i32 = if length == 0 { 0 } else { 1 };
    out.extend_from_slice(&dimensions.to_be_bytes());
    out.extend_from_slice(&i32::from(elements.null_count() > 0).to_be_bytes());
    out.extend_from_slice(&pg_type_of(elements.data_type()).oid.to_be_bytes());
    if length > 0 {
        out.extend_from_slice(&length.to_be_bytes());
        out.extend_from_slice(&1i32.to_be_bytes());
    }
    let mut element = Vec::new();
    for i in 0..elements.len() {
        element.clear();
        if !binary_value(elements, i, &mut element)? {
            out.extend_from_slice(&(-1i32).to_be_bytes());
            continue;
        }
        let size = i32::try_from(element.len()).map_err(|_| too_long())?;
        out.extend_from_slice(&size.to_be_bytes());
        out.extend_from_slice(&element);
    }
    Ok(())
}

/// Appends one value in PostgreSQL's binary format for the type `pg_type_of` gives it;
/// returns false for NULL.
pub fn binary_value(array: &ArrayRef, row: usize, out: &mut Vec<u8>) -> Result<bool> {
    if array.is_null(row) {
        return Ok(false);
    }
    match array.data_type() {
        DataType::Boolean => {
            let a = array.as_any().downcast_ref::<BooleanArray>().expect("bool");
            out.push(a.value(row) as u8);
        }
        // Unsigned integers travel as the next wider signed type (u64 as numeric), except u32,
        // which is PostgreSQL's oid.
        DataType::Int8 => out.extend_from_slice(
            &i16::from(array.as_primitive::<Int8Type>().value(row)).to_be_bytes(),
        ),
        DataType::UInt8 => out.extend_from_slice(
            &i16::from(array.as_primitive::<UInt8Type>().value(row)).to_be_bytes(),
        ),
        DataType::Int16 => {
            out.extend_from_slice(&array.as_primitive::<Int16Type>().value(row).to_be_bytes())
        }
        DataType::UInt16 => out.extend_from_slice(
            &i32::from(array.as_primitive::<UInt16Type>().value(row)).to_be_bytes(),
        ),
        DataType::Int32 => {
            out.extend_from_slice(&array.as_primitive::<Int32Type>().value(row).to_be_bytes())
        }
        DataType::UInt32 => {
            out.extend_from_slice(&array.as_primitive::<UInt32Type>().value(row).to_be_bytes())
        }
        DataType::Int64 => {
            out.extend_from_slice(&array.as_primitive::<Int64Type>().value(row).to_be_bytes())
        }
        DataType::UInt64 => {
            let v = array.as_primitive::<UInt64Type>().value(row);
            numeric_binary(i128::from(v), 0, out);
        }
        DataType::Float32 => {
            out.extend_from_slice(&array.as_primitive::<Float32Type>().value(row).to_be_bytes())
        }
        DataType::Float64 => {
            out.extend_from_slice(&array.as_primitive::<Float64Type>().value(row).to_be_bytes())
        }
        DataType::Decimal128(_, scale) => {
            let v = array
                .as_any()
                .downcast_ref::<Decimal128Array>()
                .expect("dec")
                .value(row);
            numeric_binary(v, *scale, out);
        }
        DataType::Date32 => {
            let days = array
                .as_any()
                .downcast_ref::<Date32Array>()
                .expect("date")
                .value(row) as i64;
            out.extend_from_slice(&((days - PG_EPOCH_DAYS) as i32).to_be_bytes());
        }
        DataType::Timestamp(unit, _) => {
            let micros = timestamp_micros(array, row, *unit);
            out.extend_from_slice(&micros.saturating_sub(PG_EPOCH_MICROS).to_be_bytes());
        }
        DataType::Interval(_) => {
            let v = interval_value(array, row)?;
            out.extend_from_slice(&(v.nanoseconds / 1000).to_be_bytes());
            out.extend_from_slice(&v.days.to_be_bytes());
            out.extend_from_slice(&v.months.to_be_bytes());
        }
        // An array of a built-in type (others travel as text).
        DataType::List(_) if pg_type_of(array.data_type()).oid != 25 => {
            array_binary(&array.as_list::<i32>().value(row), out)?
        }
        DataType::LargeList(_) if pg_type_of(array.data_type()).oid != 25 => {
            array_binary(&array.as_list::<i64>().value(row), out)?
        }
        // Everything else travels as text (its OID is text), whose binary form is the text.
        _ => {
            text_value(array, row, out)?;
        }
    }
    Ok(true)
}

fn timestamp_micros(array: &ArrayRef, row: usize, unit: TimeUnit) -> i64 {
    match unit {
        TimeUnit::Second => array
            .as_primitive::<TimestampSecondType>()
            .value(row)
            .saturating_mul(1_000_000),
        TimeUnit::Millisecond => array
            .as_primitive::<TimestampMillisecondType>()
            .value(row)
            .saturating_mul(1000),
        TimeUnit::Microsecond => array.as_primitive::<TimestampMicrosecondType>().value(row),
        TimeUnit::Nanosecond => array
            .as_primitive::<TimestampNanosecondType>()
            .value(row)
            .div_euclid(1000),
    }
}

fn interval_value(array: &ArrayRef, row: usize) -> Result<IntervalMonthDayNano> {
    match array.as_any().downcast_ref::<IntervalMonthDayNanoArray>() {
        Some(a) => Ok(a.value(row)),
        None => {
            let cast = datafusion::arrow::compute::cast(
                &array.slice(row, 1),
                &DataType::Interval(datafusion::arrow::datatypes::IntervalUnit::MonthDayNano),
            )?;
            Ok(cast
                .as_any()
                .downcast_ref::<IntervalMonthDayNanoArray>()
                .expect("cast to month-day-nano")
                .value(0))
        }
    }
}

#[derive(Clone, Copy)]
pub enum FloatWidth {
    Single,
    Double,
}

/// PostgreSQL's float output (extra_float_digits >= 1): the shortest digits that round-trip,
/// in fixed notation for decimal exponents from -4 up to the type's digit count, scientific
/// (`1e+20`, `1.5e-05`) outside it.
pub fn float_text(v: f64, width: FloatWidth) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 {
            "Infinity".into()
        } else {
            "-Infinity".into()
        };
    }
    if v == 0.0 {
        return if v.is_sign_negative() {
            "-0".into()
        } else {
            "0".into()
        };
    }
    let (sci, fixed_max) = match width {
        FloatWidth::Single => (format!("{:e}", v as f32), 6),
        FloatWidth::Double => (format!("{v:e}"), 15),
    };
    let (mantissa, exp) = sci.split_once('e').expect("exponent");
    let exp: i32 = exp.parse().expect("exponent is a number");
    if (-4..fixed_max).contains(&exp) {
        match width {
            FloatWidth::Single => format!("{}", v as f32),
            FloatWidth::Double => format!("{v}"),
        }
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exp.abs())
    }
}

fn timestamp_text(micros: i64, with_zone: bool) -> String {
    let secs = micros.div_euclid(1_000_000);
    let frac = micros.rem_euclid(1_000_000);
    let dt = chrono::DateTime::from_timestamp(secs, 0)
        .map(|d| d.naive_utc())
        .unwrap_or_default();
    let mut s = dt.format("%Y-%m-%d %H:%M:%S").to_string();
    if frac != 0 {
        let f = format!(".{frac:06}");
        s.push_str(f.trim_end_matches('0'));
    }
    if with_zone {
        s.push_str("+00");
    }
    s
}

/// PostgreSQL's `postgres` interval style: `1 year 2 mons 3 days 04:05:06.5`.
pub fn interval_text(v: IntervalMonthDayNano) -> String {
    let mut parts: Vec<String> = Vec::new();
    let plural = |n: i64, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
    let years = v.months / 12;
    let months = v.months % 12;
    if years != 0 {
        parts.push(plural(years as i64, "year", "years"));
    }
    if months != 0 {
        parts.push(plural(months as i64, "mon", "mons"));
    }
    if v.days != 0 {
        parts.push(plural(v.days as i64, "day", "days"));
    }
    let micros = v.nanoseconds / 1000;
    if micros != 0 || parts.is_empty() {
        let sign = if micros < 0 { "-" } else { "" };
        let m = micros.unsigned_abs();
        let (h, rest) = (m / 3_600_000_000, m % 3_600_000_000);
        let (min, rest) = (rest / 60_000_000, rest % 60_000_000);
        let (s, frac) = (rest / 1_000_000, rest % 1_000_000);
        let mut t = format!("{sign}{h:02}:{min:02}:{s:02}");
        if frac != 0 {
            let f = format!(".{frac:06}");
            t.push_str(f.trim_end_matches('0'));
        }
        parts.push(t);
    }
    parts.join(" ")
}

/// PostgreSQL's binary numeric: base-10000 digits with weight, sign and display scale.
fn numeric_binary(unscaled: i128, scale: i8, out: &mut Vec<u8>) {
    let scale = scale.max(0) as usize;
    let negative = unscaled < 0;
    // Work on the decimal digits, so that no intermediate value can overflow.
    let digits = unscaled.unsigned_abs().to_string();
    let (int_part, frac_part) = if digits.len() > scale {
        let (i, f) = digits.split_at(digits.len() - scale);
        (i.trim_start_matches('0').to_string(), f.to_string())
    } else {
        (String::new(), format!("{digits:0>scale$}"))
    };
    let int_padded = format!("{}{int_part}", "0".repeat((4 - int_part.len() % 4) % 4));
    let frac_padded = format!("{frac_part}{}", "0".repeat((4 - frac_part.len() % 4) % 4));
    let group = |chunk: &[u8]| -> i16 {
        chunk
            .iter()
            .fold(0i16, |acc, d| acc * 10 + (d - b'0') as i16)
    };
    let mut groups: Vec<i16> = int_padded
        .as_bytes()
        .chunks(4)
        .chain(frac_padded.as_bytes().chunks(4))
        .map(group)
        .collect();
    let mut weight = (int_padded.len() / 4) as i32 - 1;
    let leading_zeros = groups.iter().take_while(|g| **g == 0).count();
    groups.drain(..leading_zeros);
    weight -= leading_zeros as i32;
    while groups.last() == Some(&0) {
        groups.pop();
    }
    let sign: u16 = if negative && !groups.is_empty() {
        0x4000
    } else {
        0
    };
    out.extend_from_slice(&(groups.len() as i16).to_be_bytes());
    out.extend_from_slice(&((if groups.is_empty() { 0 } else { weight }) as i16).to_be_bytes());
    out.extend_from_slice(&sign.to_be_bytes());
    out.extend_from_slice(&(scale as i16).to_be_bytes());
    for g in groups {
        out.extend_from_slice(&g.to_be_bytes());
    }
}

/// Reads a parameter sent in binary format for PostgreSQL type `oid`, as an Arrow scalar.
pub fn decode_binary_param(oid: u32, bytes: &[u8]) -> Result<ScalarValue> {
    let bad = || {
        Error::new(
            ErrorKind::InvalidParameter,
            format!("incorrect binary data format in bind parameter of type oid {oid}"),
        )
    };
    let fixed = |n: usize| -> Result<&[u8]> {
        if bytes.len() == n {
            Ok(bytes)
        } else {
            Err(bad())
        }
    };
    Ok(match oid {
        16 => ScalarValue::Boolean(Some(fixed(1)?[0] != 0)),
        21 => ScalarValue::Int16(Some(i16::from_be_bytes(
            fixed(2)?.try_into().map_err(|_| bad())?,
        ))),
        23 => ScalarValue::Int32(Some(i32::from_be_bytes(
            fixed(4)?.try_into().map_err(|_| bad())?,
        ))),
        20 => ScalarValue::Int64(Some(i64::from_be_bytes(
            fixed(8)?.try_into().map_err(|_| bad())?,
        ))),
        700 => ScalarValue::Float32(Some(f32::from_be_bytes(
            fixed(4)?.try_into().map_err(|_| bad())?,
        ))),
        701 => ScalarValue::Float64(Some(f64::from_be_bytes(
            fixed(8)?.try_into().map_err(|_| bad())?,
        ))),
        25 | 1043 | 1042 | 0 | 705 => ScalarValue::Utf8(Some(
            std::str::from_utf8(bytes).map_err(|_| bad())?.to_string(),
        )),
        1082 => {
            let d = i32::from_be_bytes(fixed(4)?.try_into().map_err(|_| bad())?) as i64;
            ScalarValue::Date32(Some(i32::try_from(d + PG_EPOCH_DAYS).map_err(|_| bad())?))
        }
        1114 | 1184 => {
            let t = i64::from_be_bytes(fixed(8)?.try_into().map_err(|_| bad())?);
            let tz = (oid == 1184).then(|| crate::types::TIMESTAMPTZ_ZONE.into());
            ScalarValue::TimestampMicrosecond(
                Some(t.checked_add(PG_EPOCH_MICROS).ok_or_else(bad)?),
                tz,
            )
        }
        1186 => {
            let b = fixed(16)?;
            let micros = i64::from_be_bytes(b[0..8].try_into().map_err(|_| bad())?);
            let days = i32::from_be_bytes(b[8..12].try_into().map_err(|_| bad())?);
            let months = i32::from_be_bytes(b[12..16].try_into().map_err(|_| bad())?);
            ScalarValue::IntervalMonthDayNano(Some(IntervalMonthDayNano::new(
                months,
                days,
                micros.checked_mul(1000).ok_or_else(bad)?,
            )))
        }
        1700 => numeric_from_binary(bytes).ok_or_else(bad)?,
        other => {
            return Err(Error::not_supported(format!(
                "binary parameters of type oid {other} are not supported"
            ))
            .with_hint("Send the parameter in text format."))
        }
    })
}

fn numeric_from_binary(b: &[u8]) -> Option<ScalarValue> {
    if b.len() < 8 {
        return None;
    }
    // A negative count is malformed (and would wrap into a huge one).
    let ndigits = usize::try_from(i16::from_be_bytes([b[0], b[1]])).ok()?;
    let weight = i16::from_be_bytes([b[2], b[3]]) as i32;
    let sign = u16::from_be_bytes([b[4], b[5]]);
    let dscale = i16::from_be_bytes([b[6], b[7]]);
    if b.len() != 8 + 2 * ndigits || !(0..=38).contains(&dscale) || sign == 0xC000 {
        return None;
    }
    // value = sum(digit_i * 10000^(weight - i)); scale it to dscale decimal places.
    let mut unscaled: i128 = 0;
    for i in 0..ndigits {
        let d = i16::from_be_bytes([b[8 + 2 * i], b[9 + 2 * i]]) as i128;
        unscaled = unscaled.checked_mul(10_000)?.checked_add(d)?;
    }
    // unscaled now counts in units of 10000^(weight - ndigits + 1).
    let exp10 = 4 * (weight - ndigits as i32 + 1) + dscale as i32;
    if exp10 >= 0 {
        unscaled = unscaled.checked_mul(10i128.checked_pow(exp10 as u32)?)?;
    } else {
        unscaled /= 10i128.checked_pow((-exp10) as u32)?;
    }
    if sign == 0x4000 {
        unscaled = -unscaled;
    }
    let precision = 38u8;
    Some(ScalarValue::Decimal128(
        Some(unscaled),
        precision,
        dscale as i8,
    ))
}

/// How a column's values are sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Text,
    Binary,
    /// An `int2vector` or `oidvector` (an index's columns): an array whose text is its
    /// elements separated by spaces (`1 2`), and whose binary form is an array's.
    VectorText,
}

/// Rows as DataRow messages, each column encoded as `encodings` says (text by default).
pub fn data_rows(batches: &[RecordBatch], encodings: &[Encoding]) -> Result<Vec<DataRow>> {
    let mut rows = Vec::new();
    let mut value = Vec::new();
    for batch in batches {
        for row in 0..batch.num_rows() {
            let mut buf = BytesMut::new();
            for (col, array) in batch.columns().iter().enumerate() {
                value.clear();
                let present = match encodings.get(col).copied().unwrap_or(Encoding::Text) {
                    Encoding::Binary => binary_value(array, row, &mut value)?,
                    Encoding::Text => text_value(array, row, &mut value)?,
                    Encoding::VectorText => vector_text(array, row, &mut value)?,
                };
                if present {
                    buf.extend_from_slice(&(value.len() as i32).to_be_bytes());
                    buf.extend_from_slice(&value);
                } else {
                    buf.extend_from_slice(&(-1i32).to_be_bytes());
                }
            }
            rows.push(DataRow::new(buf, batch.num_columns() as i16));
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn text(a: ArrayRef) -> String {
        let mut out = vec![];
        text_value(&a, 0, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn floats_print_like_postgres() {
        for (v, s) in [
            (0.1, "0.1"),
            (100.0, "100"),
            (1e20, "1e+20"),
            (1.5e-5, "1.5e-05"),
            (123456789012345.0, "123456789012345"),
            (1234567890123456.0, "1.234567890123456e+15"),
            (-2.5, "-2.5"),
            (f64::INFINITY, "Infinity"),
        ] {
            assert_eq!(float_text(v, FloatWidth::Double), s);
        }
        assert_eq!(float_text(1234567.0, FloatWidth::Single), "1.234567e+06");
        assert_eq!(float_text(0.1f32 as f64, FloatWidth::Single), "0.1");
    }

    #[test]
    fn arrays_print_like_postgres() {
        use datafusion::arrow::array::{ListArray, StringArray};
        use datafusion::arrow::datatypes::Field;
        let list = |values: ArrayRef| -> ArrayRef {
            let field = Arc::new(Field::new("item", values.data_type().clone(), true));
            let offsets = datafusion::arrow::buffer::OffsetBuffer::from_lengths([values.len()]);
            Arc::new(ListArray::new(field, offsets, values, None))
        };
        let ints: ArrayRef = Arc::new(Int32Array::from(vec![Some(1), None, Some(-3)]));
        assert_eq!(text(list(ints)), "{1,NULL,-3}");
        let words: ArrayRef = Arc::new(StringArray::from(vec![
            Some("a"),
            Some("b c"),
            Some(""),
            Some("NULL"),
            Some("q\"x\\"),
        ]));
        assert_eq!(text(list(words)), r#"{a,"b c","","NULL","q\"x\\"}"#);
        let empty: ArrayRef = Arc::new(Int32Array::from(Vec::<i32>::new()));
        assert_eq!(text(list(empty)), "{}");
    }

    #[test]
    fn intervals_print_like_postgres() {
        let iv = |m, d, us: i64| interval_text(IntervalMonthDayNano::new(m, d, us * 1000));
        assert_eq!(iv(14, 3, 14_706_500_000), "1 year 2 mons 3 days 04:05:06.5");
        assert_eq!(iv(0, 0, 0), "00:00:00");
        assert_eq!(iv(0, -1, 0), "-1 days");
        assert_eq!(iv(0, 1, -3_600_000_000), "1 day -01:00:00");
    }

    #[test]
    fn timestamps_and_decimals_print_like_postgres() {
        let ts = Arc::new(
            datafusion::arrow::array::TimestampMicrosecondArray::from(vec![1_700_000_000_500_000])
                .with_timezone("+00:00"),
        );
        assert_eq!(text(ts), "2023-11-14 22:13:20.5+00");
        let d = Arc::new(
            Decimal128Array::from(vec![-150])
                .with_precision_and_scale(10, 2)
                .unwrap(),
        );
        assert_eq!(text(d), "-1.50");
    }

    #[test]
    fn extreme_binary_parameters_are_errors_not_panics() {
        assert!(decode_binary_param(1114, &i64::MAX.to_be_bytes()).is_err());
        assert!(decode_binary_param(1082, &i32::MAX.to_be_bytes()).is_err());
        assert!(decode_binary_param(23, &[1, 2]).is_err());
        let mut huge = vec![0, 1, 0x7f, 0xff, 0, 0, 0, 0];
        huge.extend_from_slice(&9999i16.to_be_bytes());
        assert!(decode_binary_param(1700, &huge).is_err());
    }

    #[test]
    fn numeric_binary_round_trips() {
        for (v, s) in [
            (12345678i128, 2i8),
            (-5, 3),
            (0, 2),
            (100_000_000, 4),
            (1, 0),
        ] {
            let mut out = vec![];
            numeric_binary(v, s, &mut out);
            assert_eq!(
                numeric_from_binary(&out),
                Some(ScalarValue::Decimal128(Some(v), 38, s)),
                "{v} scale {s}"
            );
        }
        // 1.5 as PostgreSQL sends it: one digit group 1, weight 0, then 5000 with scale 1.
        let pg = [0, 2, 0, 0, 0, 0, 0, 1, 0, 1, 0x13, 0x88];
        assert_eq!(
            numeric_from_binary(&pg),
            Some(ScalarValue::Decimal128(Some(15), 38, 1))
        );
        // A negative digit count, a count the bytes do not hold, digits far out of range.
        for bad in [
            &[0xff, 0xff, 0, 0, 0, 0, 0, 0][..],
            &[0x80, 0x00, 0, 0, 0, 0, 0, 0, 0, 1],
            &[0, 2, 0, 0, 0, 0, 0, 0, 0, 1],
            &[0, 1, 0x7f, 0xff, 0, 0, 0, 0, 0, 1],
        ] {
            assert_eq!(numeric_from_binary(bad), None, "{bad:?}");
        }
    }
}
