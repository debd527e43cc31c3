//! The aggregate kinds: how each call reads its argument, what it accumulates per group, and
//! how its result is computed from that, exactly for integers and numerics.

use datafusion::arrow::array::{
    Array, ArrayRef, BooleanArray, Decimal128Array, Float64Array, Int64Array,
};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{i256, DataType};
use datafusion::common::ScalarValue;

use crate::error::{Error, ErrorKind, Result};
use crate::stream::rows::RowCodec;
use crate::stream::spec::{AggCall, AggKind};

/// How an aggregate reads its argument's values.
pub(super) enum Values {
    /// Only whether the value is NULL matters.
    Presence(ArrayRef),
    /// Exact integers (and decimals' unscaled integers).
    Exact(Vec<Option<i128>>),
    Float(Float64Array),
    Bool(BooleanArray),
    /// Order-preserving bytes, for MIN/MAX.
    Ordered(ArrayRef, Vec<Vec<u8>>),
}

impl Values {
    /// Reads `call`'s argument values; `codec` is the value codec of a MIN/MAX call.
    pub(super) fn read(
        call: &AggCall,
        array: ArrayRef,
        codec: Option<&RowCodec>,
    ) -> Result<Values> {
        Ok(match call.kind {
            AggKind::Count => Values::Presence(array),
            AggKind::BoolAnd | AggKind::BoolOr => Values::Bool(
                array
                    .as_any()
                    .downcast_ref::<BooleanArray>()
                    .ok_or_else(|| Error::internal("bool_and/bool_or of a non-boolean"))?
                    .clone(),
            ),
            AggKind::Min | AggKind::Max => {
                let codec = codec.ok_or_else(|| Error::internal("min/max has no value codec"))?;
                let keys = codec.encode(std::slice::from_ref(&array))?;
                Values::Ordered(array, keys)
            }
            AggKind::Sum | AggKind::Avg | AggKind::SumCounts => match array.data_type() {
                t if is_float(t) => {
                    let f = cast(&array, &DataType::Float64)?;
                    Values::Float(
                        f.as_any()
                            .downcast_ref::<Float64Array>()
                            .expect("f64")
                            .clone(),
                    )
                }
                DataType::Decimal128(..) => {
                    let d = array
                        .as_any()
                        .downcast_ref::<Decimal128Array>()
                        .expect("dec");
                    Values::Exact(d.iter().collect())
                }
                _ => {
                    let i = cast(&array, &DataType::Int64)?;
                    let i = i.as_any().downcast_ref::<Int64Array>().expect("i64");
                    Values::Exact(i.iter().map(|v| v.map(i128::from)).collect())
                }
            },
        })
    }

    /// The order-preserving bytes of a MIN/MAX's value at `row`.
    pub(super) fn ordered(&self, row: usize) -> Option<&[u8]> {
        match self {
            Values::Ordered(_, bytes) => Some(&bytes[row]),
            _ => None,
        }
    }

    pub(super) fn is_valid(&self, row: usize) -> bool {
        match self {
            Values::Presence(a) | Values::Ordered(a, _) => a.is_valid(row),
            Values::Exact(v) => v[row].is_some(),
            Values::Float(a) => a.is_valid(row),
            Values::Bool(a) => a.is_valid(row),
        }
    }
}

/// One call's accumulator in one group.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Acc {
    Count {
        n: i64,
    },
    /// Exact sums, of integers and of decimals' unscaled integers: 256 bits cannot overflow,
    /// since at most 2^63 values of at most 2^127 each are summed, so the sum is always right
    /// even where it does not fit the result's type (then the output is NULL and an error,
    /// which goes once the sum fits again).
    Exact {
        n: i64,
        sum: i256,
    },
    Float {
        n: i64,
        sum: f64,
    },
    /// MIN/MAX: how many values; over an append-only input also the extreme itself (its
    /// order-preserving bytes), the only value that can ever be the result.
    Extreme {
        n: i64,
        best: Option<Vec<u8>>,
    },
    Bools {
        n: i64,
        trues: i64,
    },
}

/// What adding a row did to a MIN/MAX accumulator over an input that also retracts.
pub(super) enum Added {
    /// Nothing more to do.
    Done,
    /// The value's count in the group's multiset changes by the row's weight.
    CountValue,
}

impl Acc {
    /// The accumulator of `call` over no rows.
    pub(super) fn empty(call: &AggCall) -> Acc {
        match (call.kind, &call.arg_type) {
            (AggKind::Count, _) => Acc::Count { n: 0 },
            (AggKind::Min | AggKind::Max, _) => Acc::Extreme { n: 0, best: None },
            (AggKind::BoolAnd | AggKind::BoolOr, _) => Acc::Bools { n: 0, trues: 0 },
            (_, t) if is_float(t) => Acc::Float { n: 0, sum: 0.0 },
            _ => Acc::Exact {
                n: 0,
                sum: i256::ZERO,
            },
        }
    }

    /// Adds the value at `row` with weight `w` (negative for a retraction). `append_only`
    /// MIN/MAX keep the extreme here; otherwise they ask for the value to be counted.
    pub(super) fn add(
        &mut self,
        kind: AggKind,
        values: &Values,
        row: usize,
        w: i64,
        append_only: bool,
    ) -> Result<Added> {
        match (self, values) {
            (Acc::Count { n }, Values::Presence(a)) => {
                if a.is_valid(row) {
                    *n += w
                }
            }
            (Acc::Bools { n, trues }, Values::Bool(a)) => {
                if a.is_valid(row) {
                    *n += w;
                    if a.value(row) {
                        *trues += w;
                    }
                }
            }
            (Acc::Exact { n, sum }, Values::Exact(v)) => {
                if let Some(v) = v[row] {
                    *n += w;
                    // Cannot wrap: see `Acc::Exact`.
                    *sum = sum.wrapping_add(i256::from(v).wrapping_mul(i256::from(w)));
                }
            }
            (Acc::Float { n, sum }, Values::Float(v)) => {
                if v.is_valid(row) {
                    *n += w;
                    *sum += v.value(row) * w as f64;
                }
            }
            (Acc::Extreme { n, best }, Values::Ordered(a, bytes)) if append_only => {
                if a.is_valid(row) {
                    // Nothing is ever retracted: only the extreme can be the result.
                    assert!(w > 0, "an append-only input retracted a row");
                    *n += w;
                    let v = &bytes[row];
                    let better = match best {
                        None => true,
                        Some(b) if kind == AggKind::Min => v < b,
                        Some(b) => v > b,
                    };
                    if better {
                        *best = Some(v.clone());
                    }
                }
            }
            (Acc::Extreme { n, .. }, Values::Ordered(a, _)) => {
                if a.is_valid(row) {
                    *n += w;
                    return Ok(Added::CountValue);
                }
            }
            _ => return Err(Error::internal("aggregate value kind mismatch")),
        }
        Ok(Added::Done)
    }

    /// The call's result. `extreme` finds a MIN/MAX's extreme in the group's multiset of
    /// values, where the accumulator does not keep it.
    pub(super) fn output(
        &self,
        call: &AggCall,
        codec: Option<&RowCodec>,
        extreme: impl FnOnce() -> Result<Vec<u8>>,
    ) -> Result<ScalarValue> {
        let null = || ScalarValue::try_from(&call.output_type);
        let decode = |value: &[u8]| -> Result<ScalarValue> {
            let codec = codec.ok_or_else(|| Error::internal("min/max has no value codec"))?;
            let arrays = codec.decode([value])?;
            Ok(ScalarValue::try_from_array(&arrays[0], 0)?)
        };
        match (call.kind, self) {
            (AggKind::Count, Acc::Count { n }) => Ok(ScalarValue::Int64(Some(*n))),
            (AggKind::SumCounts, Acc::Exact { sum, .. }) => exact_scalar(*sum, &call.output_type),
            (
                _,
                Acc::Exact { n: 0, .. }
                | Acc::Float { n: 0, .. }
                | Acc::Extreme { n: 0, .. }
                | Acc::Bools { n: 0, .. },
            ) => Ok(null()?),
            (AggKind::BoolAnd, Acc::Bools { n, trues }) => {
                Ok(ScalarValue::Boolean(Some(trues == n)))
            }
            (AggKind::BoolOr, Acc::Bools { trues, .. }) => {
                Ok(ScalarValue::Boolean(Some(*trues > 0)))
            }
            (AggKind::Sum, Acc::Exact { sum, .. }) => exact_scalar(*sum, &call.output_type),
            (AggKind::Sum, Acc::Float { sum, .. }) => float_scalar(*sum, &call.output_type),
            (AggKind::Avg, Acc::Float { n, sum }) => {
                float_scalar(sum / *n as f64, &call.output_type)
            }
            (AggKind::Avg, Acc::Exact { n, sum }) => exact_avg(*n, *sum, call),
            (
                AggKind::Min | AggKind::Max,
                Acc::Extreme {
                    best: Some(best), ..
                },
            ) => decode(best),
            (AggKind::Min | AggKind::Max, Acc::Extreme { .. }) => decode(&extreme()?),
            (kind, acc) => Err(Error::internal(format!(
                "aggregate {kind:?} has accumulator {acc:?}"
            ))),
        }
    }
}

/// avg of integers or numerics: the exact sum over the count, at the result's scale.
fn exact_avg(n: i64, sum: i256, call: &AggCall) -> Result<ScalarValue> {
    match (&call.arg_type, &call.output_type) {
        (DataType::Decimal128(_, s_in), DataType::Decimal128(p, s_out)) => {
            let scaled = i256::from(10)
                .checked_pow((*s_out - *s_in).max(0) as u32)
                .and_then(|f| sum.checked_mul(f))
                .ok_or_else(|| out_of_range("avg"))?;
            let v = scaled
                .checked_div(i256::from(n))
                .and_then(i256::to_i128)
                .ok_or_else(|| out_of_range("numeric"))?;
            decimal_scalar(v, *p, *s_out)
        }
        (_, t) => float_scalar(to_f64(sum) / n as f64, t),
    }
}

fn is_float(t: &DataType) -> bool {
    matches!(t, DataType::Float16 | DataType::Float32 | DataType::Float64)
}

fn out_of_range(what: &str) -> Error {
    Error::new(ErrorKind::NumericOutOfRange, format!("{what} out of range"))
}

fn exact_scalar(v: i256, t: &DataType) -> Result<ScalarValue> {
    if let DataType::Float64 = t {
        return Ok(ScalarValue::Float64(Some(to_f64(v))));
    }
    let v = v.to_i128().ok_or_else(|| out_of_range("numeric"))?;
    Ok(match t {
        DataType::Int64 => {
            ScalarValue::Int64(Some(i64::try_from(v).map_err(|_| out_of_range("bigint"))?))
        }
        DataType::UInt64 => {
            ScalarValue::UInt64(Some(u64::try_from(v).map_err(|_| out_of_range("sum"))?))
        }
        DataType::Decimal128(p, s) => decimal_scalar(v, *p, *s)?,
        DataType::Float64 => ScalarValue::Float64(Some(v as f64)),
        other => return Err(Error::internal(format!("exact sum into {other}"))),
    })
}

fn to_f64(v: i256) -> f64 {
    let (low, high) = v.to_parts();
    high as f64 * 2f64.powi(128) + low as f64
}

fn decimal_scalar(v: i128, precision: u8, scale: i8) -> Result<ScalarValue> {
    if v.unsigned_abs() >= 10u128.pow(precision as u32) {
        return Err(out_of_range("numeric"));
    }
    Ok(ScalarValue::Decimal128(Some(v), precision, scale))
}

fn float_scalar(v: f64, t: &DataType) -> Result<ScalarValue> {
    Ok(match t {
        DataType::Float64 => ScalarValue::Float64(Some(v)),
        DataType::Float32 => ScalarValue::Float32(Some(v as f32)),
        other => return Err(Error::internal(format!("float aggregate into {other}"))),
    })
}
