//! Types, schemas and constant values as a stored plan keeps them: readable JSON for the types
//! and values Weir's plans hold, and Arrow IPC bytes (base64) for any other, so that every
//! type still has an encoding.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::{
    DataType, Field, FieldRef, IntervalDayTime, IntervalMonthDayNano, IntervalUnit, Schema,
    SchemaRef, TimeUnit,
};
use datafusion::arrow::ipc::reader::StreamReader;
use datafusion::arrow::ipc::writer::StreamWriter;
use datafusion::common::ScalarValue;
use serde::{Deserialize, Serialize};

use crate::error::{Error, ErrorKind, Result};

pub(super) fn corrupt(what: impl std::fmt::Display) -> Error {
    Error::new(
        ErrorKind::DataCorruption,
        format!("a view's stored plan cannot be read: {what}"),
    )
}

/// A data type.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Type {
    Null,
    Boolean,
    Int8,
    Int16,
    Int32,
    Int64,
    UInt8,
    UInt16,
    UInt32,
    UInt64,
    Float32,
    Float64,
    Utf8,
    LargeUtf8,
    Utf8View,
    Binary,
    LargeBinary,
    Date32,
    Date64,
    Timestamp(Unit, Option<String>),
    Time32(Unit),
    Time64(Unit),
    Duration(Unit),
    Interval(Interval),
    Decimal128(u8, i8),
    Decimal256(u8, i8),
    /// Any other type: a one-field schema as Arrow IPC.
    Arrow(Ipc),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Unit {
    Second,
    Millisecond,
    Microsecond,
    Nanosecond,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Interval {
    YearMonth,
    DayTime,
    MonthDayNano,
}

impl Unit {
    fn of(u: &TimeUnit) -> Unit {
        match u {
            TimeUnit::Second => Unit::Second,
            TimeUnit::Millisecond => Unit::Millisecond,
            TimeUnit::Microsecond => Unit::Microsecond,
            TimeUnit::Nanosecond => Unit::Nanosecond,
        }
    }

    fn arrow(self) -> TimeUnit {
        match self {
            Unit::Second => TimeUnit::Second,
            Unit::Millisecond => TimeUnit::Millisecond,
            Unit::Microsecond => TimeUnit::Microsecond,
            Unit::Nanosecond => TimeUnit::Nanosecond,
        }
    }
}

impl Type {
    pub fn of(t: &DataType) -> Result<Type> {
        use DataType as D;
        Ok(match t {
            D::Null => Type::Null,
            D::Boolean => Type::Boolean,
            D::Int8 => Type::Int8,
            D::Int16 => Type::Int16,
            D::Int32 => Type::Int32,
            D::Int64 => Type::Int64,
            D::UInt8 => Type::UInt8,
            D::UInt16 => Type::UInt16,
            D::UInt32 => Type::UInt32,
            D::UInt64 => Type::UInt64,
            D::Float32 => Type::Float32,
            D::Float64 => Type::Float64,
            D::Utf8 => Type::Utf8,
            D::LargeUtf8 => Type::LargeUtf8,
            D::Utf8View => Type::Utf8View,
            D::Binary => Type::Binary,
            D::LargeBinary => Type::LargeBinary,
            D::Date32 => Type::Date32,
            D::Date64 => Type::Date64,
            D::Timestamp(u, tz) => Type::Timestamp(Unit::of(u), tz.as_ref().map(|z| z.to_string())),
            D::Time32(u) => Type::Time32(Unit::of(u)),
            D::Time64(u) => Type::Time64(Unit::of(u)),
            D::Duration(u) => Type::Duration(Unit::of(u)),
            D::Interval(IntervalUnit::YearMonth) => Type::Interval(Interval::YearMonth),
            D::Interval(IntervalUnit::DayTime) => Type::Interval(Interval::DayTime),
            D::Interval(IntervalUnit::MonthDayNano) => Type::Interval(Interval::MonthDayNano),
            D::Decimal128(p, s) => Type::Decimal128(*p, *s),
            D::Decimal256(p, s) => Type::Decimal256(*p, *s),
            other => Type::Arrow(Ipc::of_schema(&Schema::new(vec![Field::new(
                "t",
                other.clone(),
                true,
            )]))?),
        })
    }

    pub fn arrow(&self) -> Result<DataType> {
        use DataType as D;
        Ok(match self {
            Type::Null => D::Null,
            Type::Boolean => D::Boolean,
            Type::Int8 => D::Int8,
            Type::Int16 => D::Int16,
            Type::Int32 => D::Int32,
            Type::Int64 => D::Int64,
            Type::UInt8 => D::UInt8,
            Type::UInt16 => D::UInt16,
            Type::UInt32 => D::UInt32,
            Type::UInt64 => D::UInt64,
            Type::Float32 => D::Float32,
            Type::Float64 => D::Float64,
            Type::Utf8 => D::Utf8,
            Type::LargeUtf8 => D::LargeUtf8,
            Type::Utf8View => D::Utf8View,
            Type::Binary => D::Binary,
            Type::LargeBinary => D::LargeBinary,
            Type::Date32 => D::Date32,
            Type::Date64 => D::Date64,
            Type::Timestamp(u, tz) => D::Timestamp(u.arrow(), tz.as_deref().map(Arc::from)),
            Type::Time32(u) => D::Time32(u.arrow()),
            Type::Time64(u) => D::Time64(u.arrow()),
            Type::Duration(u) => D::Duration(u.arrow()),
            Type::Interval(Interval::YearMonth) => D::Interval(IntervalUnit::YearMonth),
            Type::Interval(Interval::DayTime) => D::Interval(IntervalUnit::DayTime),
            Type::Interval(Interval::MonthDayNano) => D::Interval(IntervalUnit::MonthDayNano),
            Type::Decimal128(p, s) => D::Decimal128(*p, *s),
            Type::Decimal256(p, s) => D::Decimal256(*p, *s),
            Type::Arrow(ipc) => ipc.only_field()?.data_type().clone(),
        })
    }
}

/// A field: its name, type and nullability, and its metadata where it has any.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StoredField {
    name: String,
    #[serde(rename = "type")]
    data_type: Type,
    nullable: bool,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    metadata: BTreeMap<String, String>,
}

impl StoredField {
    pub fn of(f: &Field) -> Result<StoredField> {
        Ok(StoredField {
            name: f.name().clone(),
            data_type: Type::of(f.data_type())?,
            nullable: f.is_nullable(),
            metadata: f.metadata().clone().into_iter().collect(),
        })
    }

    pub fn arrow(&self) -> Result<FieldRef> {
        let metadata: HashMap<String, String> = self.metadata.clone().into_iter().collect();
        Ok(Arc::new(
            Field::new(&self.name, self.data_type.arrow()?, self.nullable).with_metadata(metadata),
        ))
    }
}

/// A schema: its fields, and its metadata where it has any.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StoredSchema {
    fields: Vec<StoredField>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    metadata: BTreeMap<String, String>,
}

impl StoredSchema {
    pub fn of(s: &Schema) -> Result<StoredSchema> {
        Ok(StoredSchema {
            fields: s
                .fields()
                .iter()
                .map(|f| StoredField::of(f))
                .collect::<Result<_>>()?,
            metadata: s.metadata().clone().into_iter().collect(),
        })
    }

    pub fn arrow(&self) -> Result<SchemaRef> {
        let fields = self
            .fields
            .iter()
            .map(StoredField::arrow)
            .collect::<Result<Vec<_>>>()?;
        let metadata: HashMap<String, String> = self.metadata.clone().into_iter().collect();
        Ok(Arc::new(Schema::new(fields).with_metadata(metadata)))
    }
}

/// A constant: its type and its value (`null` for NULL), or Arrow IPC bytes of a one-row batch
/// for a type without a JSON form here.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Value {
    Json {
        #[serde(rename = "type")]
        data_type: Type,
        value: serde_json::Value,
    },
    Arrow {
        arrow: Ipc,
    },
}

impl Value {
    pub fn of(v: &ScalarValue) -> Result<Value> {
        match json_of(v) {
            Some(value) => Ok(Value::Json {
                data_type: Type::of(&v.data_type())?,
                value,
            }),
            None => {
                let field = Field::new("v", v.data_type(), true);
                let batch =
                    RecordBatch::try_new(Arc::new(Schema::new(vec![field])), vec![v.to_array()?])?;
                Ok(Value::Arrow {
                    arrow: Ipc::of_batch(&batch, true)?,
                })
            }
        }
    }

    pub fn scalar(&self) -> Result<ScalarValue> {
        match self {
            Value::Json { data_type, value } => scalar_of(&data_type.arrow()?, value),
            Value::Arrow { arrow } => {
                let batch = arrow
                    .reader()?
                    .next()
                    .ok_or_else(|| corrupt("a constant without its value"))??;
                if batch.num_rows() != 1 || batch.num_columns() != 1 {
                    return Err(corrupt("a constant of other than one value"));
                }
                Ok(ScalarValue::try_from_array(batch.column(0), 0)?)
            }
        }
    }
}

/// The JSON form of `v`: numbers for integers (and dates, times and durations, in their
/// units), text for floats (Rust's shortest exact form, with `NaN` and `inf`), decimals (the
/// unscaled integer), strings; `null` for NULL of any type.
fn json_of(v: &ScalarValue) -> Option<serde_json::Value> {
    use serde_json::json;
    use ScalarValue as S;
    if v.is_null() {
        return Some(serde_json::Value::Null);
    }
    Some(match v {
        S::Boolean(Some(b)) => json!(b),
        S::Int8(Some(x)) => json!(x),
        S::Int16(Some(x)) => json!(x),
        S::Int32(Some(x)) => json!(x),
        S::Int64(Some(x)) => json!(x),
        S::UInt8(Some(x)) => json!(x),
        S::UInt16(Some(x)) => json!(x),
        S::UInt32(Some(x)) => json!(x),
        S::UInt64(Some(x)) => json!(x),
        S::Float32(Some(x)) => json!(format!("{x:?}")),
        S::Float64(Some(x)) => json!(format!("{x:?}")),
        S::Utf8(Some(s)) | S::LargeUtf8(Some(s)) | S::Utf8View(Some(s)) => json!(s),
        S::Decimal128(Some(x), _, _) => json!(x.to_string()),
        S::Date32(Some(x)) | S::Time32Second(Some(x)) | S::Time32Millisecond(Some(x)) => {
            json!(x)
        }
        S::IntervalYearMonth(Some(x)) => json!(x),
        S::Date64(Some(x))
        | S::Time64Microsecond(Some(x))
        | S::Time64Nanosecond(Some(x))
        | S::TimestampSecond(Some(x), _)
        | S::TimestampMillisecond(Some(x), _)
        | S::TimestampMicrosecond(Some(x), _)
        | S::TimestampNanosecond(Some(x), _)
        | S::DurationSecond(Some(x))
        | S::DurationMillisecond(Some(x))
        | S::DurationMicrosecond(Some(x))
        | S::DurationNanosecond(Some(x)) => json!(x),
        S::IntervalDayTime(Some(i)) => json!([i.days, i.milliseconds]),
        S::IntervalMonthDayNano(Some(i)) => json!([i.months, i.days, i.nanoseconds]),
        _ => return None,
    })
}

fn scalar_of(t: &DataType, value: &serde_json::Value) -> Result<ScalarValue> {
    use DataType as D;
    use ScalarValue as S;
    if value.is_null() {
        return Ok(ScalarValue::try_from(t)?);
    }
    let bad = || corrupt(format!("{value} is not a constant of type {t}"));
    let int = || value.as_i64().ok_or_else(bad);
    let uint = || value.as_u64().ok_or_else(bad);
    let text = || value.as_str().ok_or_else(bad);
    let narrow = |x: i64| -> Result<i32> { i32::try_from(x).map_err(|_| bad()) };
    let parts = |n: usize| -> Result<Vec<i64>> {
        let parts: Vec<i64> = value
            .as_array()
            .ok_or_else(bad)?
            .iter()
            .map(|p| p.as_i64().ok_or_else(bad))
            .collect::<Result<_>>()?;
        if parts.len() != n {
            return Err(bad());
        }
        Ok(parts)
    };
    Ok(match t {
        D::Boolean => S::Boolean(Some(value.as_bool().ok_or_else(bad)?)),
        D::Int8 => S::Int8(Some(i8::try_from(int()?).map_err(|_| bad())?)),
        D::Int16 => S::Int16(Some(i16::try_from(int()?).map_err(|_| bad())?)),
        D::Int32 => S::Int32(Some(narrow(int()?)?)),
        D::Int64 => S::Int64(Some(int()?)),
        D::UInt8 => S::UInt8(Some(u8::try_from(uint()?).map_err(|_| bad())?)),
        D::UInt16 => S::UInt16(Some(u16::try_from(uint()?).map_err(|_| bad())?)),
        D::UInt32 => S::UInt32(Some(u32::try_from(uint()?).map_err(|_| bad())?)),
        D::UInt64 => S::UInt64(Some(uint()?)),
        D::Float32 => S::Float32(Some(text()?.parse().map_err(|_| bad())?)),
        D::Float64 => S::Float64(Some(text()?.parse().map_err(|_| bad())?)),
        D::Utf8 => S::Utf8(Some(text()?.to_string())),
        D::LargeUtf8 => S::LargeUtf8(Some(text()?.to_string())),
        D::Utf8View => S::Utf8View(Some(text()?.to_string())),
        D::Decimal128(p, s) => S::Decimal128(Some(text()?.parse().map_err(|_| bad())?), *p, *s),
        D::Date32 => S::Date32(Some(narrow(int()?)?)),
        D::Date64 => S::Date64(Some(int()?)),
        D::Time32(TimeUnit::Second) => S::Time32Second(Some(narrow(int()?)?)),
        D::Time32(TimeUnit::Millisecond) => S::Time32Millisecond(Some(narrow(int()?)?)),
        D::Time64(TimeUnit::Microsecond) => S::Time64Microsecond(Some(int()?)),
        D::Time64(TimeUnit::Nanosecond) => S::Time64Nanosecond(Some(int()?)),
        D::Timestamp(u, tz) => {
            let (x, tz) = (Some(int()?), tz.clone());
            match u {
                TimeUnit::Second => S::TimestampSecond(x, tz),
                TimeUnit::Millisecond => S::TimestampMillisecond(x, tz),
                TimeUnit::Microsecond => S::TimestampMicrosecond(x, tz),
                TimeUnit::Nanosecond => S::TimestampNanosecond(x, tz),
            }
        }
        D::Duration(TimeUnit::Second) => S::DurationSecond(Some(int()?)),
        D::Duration(TimeUnit::Millisecond) => S::DurationMillisecond(Some(int()?)),
        D::Duration(TimeUnit::Microsecond) => S::DurationMicrosecond(Some(int()?)),
        D::Duration(TimeUnit::Nanosecond) => S::DurationNanosecond(Some(int()?)),
        D::Interval(IntervalUnit::YearMonth) => S::IntervalYearMonth(Some(narrow(int()?)?)),
        D::Interval(IntervalUnit::DayTime) => {
            let p = parts(2)?;
            S::IntervalDayTime(Some(IntervalDayTime::new(narrow(p[0])?, narrow(p[1])?)))
        }
        D::Interval(IntervalUnit::MonthDayNano) => {
            let p = parts(3)?;
            S::IntervalMonthDayNano(Some(IntervalMonthDayNano::new(
                narrow(p[0])?,
                narrow(p[1])?,
                p[2],
            )))
        }
        _ => return Err(bad()),
    })
}

/// Arrow IPC stream bytes, base64: a schema, or a schema and one batch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Ipc(String);

impl Ipc {
    fn of_schema(schema: &Schema) -> Result<Ipc> {
        Ipc::of_batch(&RecordBatch::new_empty(Arc::new(schema.clone())), false)
    }

    fn of_batch(batch: &RecordBatch, with_rows: bool) -> Result<Ipc> {
        use base64::Engine;
        let mut bytes = Vec::new();
        {
            let mut w = StreamWriter::try_new(&mut bytes, &batch.schema())?;
            if with_rows {
                w.write(batch)?;
            }
            w.finish()?;
        }
        Ok(Ipc(base64::engine::general_purpose::STANDARD.encode(bytes)))
    }

    fn reader(&self) -> Result<StreamReader<std::io::Cursor<Vec<u8>>>> {
        use base64::Engine;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(&self.0)
            .map_err(|e| corrupt(format!("bad base64: {e}")))?;
        Ok(StreamReader::try_new(std::io::Cursor::new(bytes), None)?)
    }

    fn only_field(&self) -> Result<FieldRef> {
        let schema = self.reader()?.schema();
        match schema.fields().first() {
            Some(f) if schema.fields().len() == 1 => Ok(f.clone()),
            _ => Err(corrupt("a type stored as a schema of other than one field")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_and_constants_read_back_exactly() {
        let types = [
            DataType::Int64,
            DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into())),
            DataType::Decimal128(38, 10),
            DataType::Interval(IntervalUnit::MonthDayNano),
            DataType::List(Arc::new(Field::new("item", DataType::Int32, true))),
        ];
        for t in types {
            let json = serde_json::to_string(&Type::of(&t).unwrap()).unwrap();
            let read: Type = serde_json::from_str(&json).unwrap();
            assert_eq!(read.arrow().unwrap(), t, "{json}");
        }
        assert_eq!(
            serde_json::to_string(&Type::of(&DataType::Decimal128(20, 3)).unwrap()).unwrap(),
            r#"{"Decimal128":[20,3]}"#
        );
        let values = [
            ScalarValue::Int32(Some(-5)),
            ScalarValue::UInt64(Some(u64::MAX)),
            ScalarValue::Int64(None),
            ScalarValue::Float64(Some(0.1 + 0.2)),
            ScalarValue::Float64(Some(f64::NAN)),
            ScalarValue::Float32(Some(f32::NEG_INFINITY)),
            ScalarValue::Decimal128(Some(-123_456_789_012_345_678_901_234), 38, 10),
            ScalarValue::Utf8(Some("it's \"quoted\"".into())),
            ScalarValue::TimestampMicrosecond(Some(-1), Some("+00:00".into())),
            ScalarValue::IntervalMonthDayNano(Some(IntervalMonthDayNano::new(1, -2, 3_000))),
            ScalarValue::Date32(Some(19_000)),
            ScalarValue::Null,
            ScalarValue::Binary(Some(vec![0, 1, 255])),
        ];
        for v in values {
            let json = serde_json::to_string(&Value::of(&v).unwrap()).unwrap();
            let read: Value = serde_json::from_str(&json).unwrap();
            let read = read.scalar().unwrap();
            assert_eq!(read.data_type(), v.data_type(), "{json}");
            // NaN equals itself as a ScalarValue (total order).
            assert_eq!(read, v, "{json}");
        }
    }
}
